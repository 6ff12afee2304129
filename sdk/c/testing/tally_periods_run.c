/* The host run of tally_periods_run.h: the project built and the job run by
 * the `tally` binary through system(3) (each argument single-quoted for
 * the shell), its outputs read back with stdio and decoded with the SDK's
 * own JSON decoder (tally_json.h, compiled in tally_periods.c), every size
 * read from them bounded before anything is allocated for it. */
#define _XOPEN_SOURCE 700

#include "tally_periods_run.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tally_json.h"
#include "tally_periods.h"

struct tally_periods_run {
    char *tally; /* the binary */
    char *dir;   /* the job's directory */
    /* How many bytes of each output the earlier sends returned. */
    off_t periods_read, dead_letters_read;
};

/* Most bytes of tally's stderr an error quotes (its end). */
enum { STDERR_QUOTED = 16 << 10 };

/* ---- Text ------------------------------------------------------------------ */

static void *grown(void *ptr, size_t size) {
    void *out = realloc(ptr, size ? size : 1);
    if (!out) {
        fprintf(stderr, "tally_periods_run: out of memory\n");
        abort();
    }
    return out;
}

/* `text` NUL-terminated, as a malloc'd string (the text freed). */
static char *finished(tally_text *text) {
    tally_text_bytes(text, "", 1);
    char *out = grown(NULL, text->len);
    memcpy(out, text->bytes, text->len);
    tally_text_free(text);
    return out;
}

static char *copy_of(const void *bytes, size_t len) {
    char *out = grown(NULL, len + 1);
    if (len) memcpy(out, bytes, len);
    out[len] = 0;
    return out;
}

static char *formatted(const char *format, ...) __attribute__((format(printf, 1, 2), nonnull(1)));
static char *formatted(const char *format, ...) {
    va_list args;
    va_start(args, format);
    int len = vsnprintf(NULL, 0, format, args);
    va_end(args);
    if (len < 0) return copy_of("tally_periods_run: an error that does not format", 48);
    char *out = grown(NULL, (size_t)len + 1);
    va_start(args, format);
    vsnprintf(out, (size_t)len + 1, format, args);
    va_end(args);
    return out;
}

/* Appends `word` single-quoted for sh (a quote written '\''). */
static void quoted(tally_text *command, const char *word) {
    tally_text_str(command, "'");
    for (const char *c = word; *c; c++) {
        if (*c == '\'')
            tally_text_str(command, "'\\''");
        else
            tally_text_bytes(command, c, 1);
    }
    tally_text_str(command, "' ");
}

static char *path_in(const char *dir, const char *name) { return formatted("%s/%s", dir, name); }

/* ---- Files ----------------------------------------------------------------- */

/* Reads `path` from byte `from` to its end into `*out` (NUL-terminated,
 * malloc'd) and `*len`: at most `max` bytes, else an error (a missing file
 * reads as empty). NULL, or the error. */
static char *read_from(const char *path, off_t from, size_t max, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *file = fopen(path, "rb");
    if (!file) {
        if (errno == ENOENT) {
            *out = copy_of("", 0);
            return NULL;
        }
        return formatted("tally_periods_run: cannot open %s: %s", path, strerror(errno));
    }
    char *error = NULL;
    off_t size;
    if (fseeko(file, 0, SEEK_END) != 0 || (size = ftello(file)) < 0) {
        error = formatted("tally_periods_run: cannot read %s: %s", path, strerror(errno));
    } else if (size < from) {
        error = formatted("tally_periods_run: %s shrank from %lld to %lld bytes", path, (long long)from, (long long)size);
    } else if ((unsigned long long)(size - from) > max) {
        error = formatted("tally_periods_run: %s grew by %lld bytes, more than the %zu one send reads", path,
                          (long long)(size - from), max);
    } else {
        size_t n = (size_t)(size - from);
        char *bytes = grown(NULL, n + 1);
        if (fseeko(file, from, SEEK_SET) != 0 || fread(bytes, 1, n, file) != n) {
            free(bytes);
            error = formatted("tally_periods_run: cannot read %s", path);
        } else {
            bytes[n] = 0;
            *out = bytes;
            *len = n;
        }
    }
    fclose(file);
    return error;
}

static char *write_file(const char *path, const char *mode, const char *bytes, size_t len) {
    FILE *file = fopen(path, mode);
    if (!file) return formatted("tally_periods_run: cannot write %s: %s", path, strerror(errno));
    bool written = len == 0 || fwrite(bytes, 1, len, file) == len;
    if (fclose(file) != 0) written = false;
    return written ? NULL : formatted("tally_periods_run: cannot write %s", path);
}

/* ---- Running tally --------------------------------------------------------- */

/* Runs `tally <args>` in `dir` (args already quoted), its stdout and
 * stderr to files there: NULL, or an error naming its stderr. */
static char *run_tally(const struct tally_periods_run *run, const char *dir, const char *args) {
    char *stdout_path = path_in(run->dir, "tally.stdout"), *stderr_path = path_in(run->dir, "tally.stderr");
    tally_text command = {0};
    tally_text_str(&command, "cd ");
    quoted(&command, dir);
    tally_text_str(&command, "&& ");
    quoted(&command, run->tally);
    tally_text_str(&command, args);
    tally_text_str(&command, " >");
    quoted(&command, stdout_path);
    tally_text_str(&command, "2>");
    quoted(&command, stderr_path);
    char *line = finished(&command);
    fflush(NULL);
    int status = system(line);
    free(line);
    char *error = NULL;
    if (status == -1) {
        error = formatted("tally_periods_run: cannot run `%s %s`: %s", run->tally, args, strerror(errno));
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        /* Quote the end of its stderr. */
        char *said = NULL;
        size_t len = 0;
        struct stat info;
        off_t from = stat(stderr_path, &info) == 0 && info.st_size > STDERR_QUOTED ? info.st_size - STDERR_QUOTED : 0;
        char *unread = read_from(stderr_path, from, STDERR_QUOTED, &said, &len);
        while (len && (said[len - 1] == '\n' || said[len - 1] == ' ')) said[--len] = 0;
        error = formatted("tally_periods_run: `%s %s` failed (%s %d): %s", run->tally, args,
                          WIFEXITED(status) ? "exit status" : "signal",
                          WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? WTERMSIG(status) : status,
                          unread ? unread : len ? said : "(no stderr)");
        free(unread);
        free(said);
    }
    free(stdout_path);
    free(stderr_path);
    return error;
}

/* The executable `name` on PATH (absolute), else NULL. */
static char *on_path(const char *name) {
    const char *path = getenv("PATH");
    while (path && *path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        char *candidate = formatted("%.*s/%s", (int)(len ? len : 1), len ? path : ".", name);
        struct stat info;
        if (stat(candidate, &info) == 0 && S_ISREG(info.st_mode) && access(candidate, X_OK) == 0) {
            char *absolute = realpath(candidate, NULL);
            free(candidate);
            return absolute;
        }
        free(candidate);
        path = colon ? colon + 1 : NULL;
    }
    return NULL;
}

/* $TALLY_BIN (a path, made absolute, or a name looked up on PATH), else
 * `tally` on PATH: NULL, or why not, with `*tally` set. */
static char *find_tally(char **tally) {
    const char *bin = getenv("TALLY_BIN");
    if (bin && *bin) {
        *tally = strchr(bin, '/') ? realpath(bin, NULL) : on_path(bin);
        return *tally ? NULL : formatted("tally_periods_run: TALLY_BIN is %s, which is not a file or not on PATH", bin);
    }
    *tally = on_path("tally");
    return *tally ? NULL
                  : formatted("tally_periods_run: no `tally` binary: set TALLY_BIN to its path, or put `tally` on PATH "
                              "(build it with `cargo install --path host` in the Tally tree)");
}

static int removed(const char *path, const struct stat *info, int type, struct FTW *at) {
    (void)info;
    (void)type;
    (void)at;
    return remove(path);
}

void tally_periods_run_end(tally_periods_run *run) {
    if (!run) return;
    if (run->dir && nftw(run->dir, removed, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "tally_periods_run: cannot remove %s: %s\n", run->dir, strerror(errno));
    free(run->dir);
    free(run->tally);
    free(run);
}

static tally_periods_run *failed_start(tally_periods_run *run, char *error) {
    fprintf(stderr, "%s\n", error);
    free(error);
    tally_periods_run_end(run);
    return NULL;
}

tally_periods_run *tally_periods_run_start(const char *plugin_dir, const char *periods_toml, const char *plugin_config_toml) {
    tally_periods_run *run = grown(NULL, sizeof *run);
    *run = (tally_periods_run){0};
    char *error = find_tally(&run->tally);
    if (error) return failed_start(run, error);
    char *project = realpath(plugin_dir, NULL);
    if (!project) return failed_start(run, formatted("tally_periods_run: the plugin directory %s: %s", plugin_dir, strerror(errno)));
    const char *tmp = getenv("TMPDIR");
    char *dir = formatted("%s/tally-periods-run-c-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        char *error = formatted("tally_periods_run: cannot make a directory like %s: %s", dir, strerror(errno));
        free(dir);
        free(project);
        return failed_start(run, error);
    }
    run->dir = dir;

    char *wasm = path_in(dir, "plugin.wasm");
    tally_text args = {0};
    tally_text_str(&args, "plugin build ");
    quoted(&args, project);
    tally_text_str(&args, "--out ");
    quoted(&args, wasm);
    char *build = finished(&args);
    error = run_tally(run, dir, build);
    free(build);
    free(wasm);
    free(project);
    if (error) return failed_start(run, error);

    tally_text job = {0};
    tally_text_str(&job,
                   "name = \"test\"\n"
                   "plugin = \"plugin.wasm\"\n"
                   "outputs = [\"periods\"]\n"
                   "[local]\n"
                   "inputs = [\"events.ndjson\"]\n"
                   "output_dir = \"out\"\n"
                   "state_dir = \"state\"\n"
                   "[periods]\n");
    tally_text_str(&job, periods_toml ? periods_toml : "");
    tally_text_str(&job, "\n[plugin_config]\n");
    tally_text_str(&job, plugin_config_toml ? plugin_config_toml : "");
    tally_text_str(&job, "\n");
    char *toml = finished(&job);
    char *path = path_in(dir, "job.toml");
    error = write_file(path, "wb", toml, strlen(toml));
    free(path);
    free(toml);
    if (!error) {
        path = path_in(dir, "events.ndjson");
        error = write_file(path, "wb", "", 0);
        free(path);
    }
    if (error) return failed_start(run, error);
    return run;
}

/* ---- Reading the outputs --------------------------------------------------- */

/* A JSON integer's text as a u64 (digits only, at most 2^64 − 1). */
static bool u64_of_text(const uint8_t *text, size_t len, uint64_t *out) {
    if (!len || (len > 1 && text[0] == '0')) return false;
    uint64_t value = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9') return false;
        unsigned digit = text[i] - '0';
        if (value > (UINT64_MAX - digit) / 10) return false;
        value = value * 10 + digit;
    }
    *out = value;
    return true;
}

static bool string_member(const tally_json *object, const char *name, char **out) {
    const tally_json *value = tally_json_get(object, name);
    if (!tally_json_is_text(value)) return false;
    *out = copy_of(value->text, value->len);
    return true;
}

static bool u64_member(const tally_json *object, const char *name, uint64_t *out) {
    const tally_json *value = tally_json_get(object, name);
    return tally_json_is_number(value) && tally_json_u64(value, out);
}

static void record_free(tally_periods_record *record) {
    free(record->type);
    free(record->customer);
    free(record->period);
    free(record->start);
    free(record->end);
    free(record->fields);
    *record = (tally_periods_record){0};
}

/* One line of out/periods.ndjson: NULL, or what is wrong with it. */
static const char *read_record(const char *line, size_t len, tally_periods_record *record) {
    *record = (tally_periods_record){0};
    tally_json json;
    tally_text why = {0};
    bool decoded = tally_json_decode((const uint8_t *)line, len, 0, &json, &why);
    tally_text_free(&why);
    if (!decoded) return "is not JSON";
    const tally_json *value = tally_json_get(&json, "value");
    if (!value || value->kind != TALLY_JSON_OBJECT) return "has no object `value`";
    record->fields = copy_of(value->raw, value->raw_len);
    if (!string_member(value, "type", &record->type) || !string_member(value, "period", &record->period) ||
        !string_member(value, "start", &record->start) || !string_member(value, "end", &record->end))
        return "lacks a text `type`, `period`, `start` or `end`";
    if (!string_member(value, "customer", &record->customer)) record->customer = copy_of("", 0);
    if (!u64_member(value, "value", &record->value) || !u64_member(value, "version", &record->version))
        return "lacks a `value` or `version` from 0 to 2^64 - 1";
    record->final = strcmp(record->type, "final") == 0;
    if (record->final) return NULL;
    if (strcmp(record->type, "adjustment") != 0) return "is neither a final nor an adjustment";
    if (!u64_member(value, "previous", &record->previous)) return "lacks a `previous` from 0 to 2^64 - 1";
    const tally_json *delta = tally_json_get(value, "delta");
    if (!tally_json_is_number(delta)) return "lacks a `delta`";
    bool negative = delta->len && delta->text[0] == '-';
    uint64_t magnitude;
    if (!u64_of_text(delta->text + negative, delta->len - negative, &magnitude) || (negative && magnitude == 0))
        return "has a `delta` that is not an integer within 2^64 - 1 either way";
    record->delta_negative = negative;
    record->delta = negative ? 0 - magnitude : magnitude;
    if (record->previous + record->delta != record->value) return "has a `delta` that is not `value` - `previous`";
    return NULL;
}

/* One line of out/dead-letters.ndjson: NULL, or what is wrong with it. */
static const char *read_dead_letter(const char *line, size_t len, tally_periods_dead_letter *dead_letter) {
    *dead_letter = (tally_periods_dead_letter){0};
    tally_json json;
    tally_text why = {0};
    bool decoded = tally_json_decode((const uint8_t *)line, len, 0, &json, &why);
    tally_text_free(&why);
    if (!decoded) return "is not JSON";
    if (!u64_member(tally_json_get(&json, "source"), "offset", &dead_letter->offset))
        return "lacks a `source` `offset` from 0 to 2^64 - 1";
    if (!string_member(&json, "reason", &dead_letter->reason)) return "lacks a text `reason`";
    return NULL;
}

/* The complete lines out/<name> gained past `*read` (which moves past
 * them), each read by `read_line` into an item of `*items` (grown as they
 * are read). NULL, or an error. */
static char *read_lines(const tally_periods_run *run, const char *name, off_t *read, void **items, size_t *count,
                        size_t item_size, const char *(*read_line)(const char *, size_t, void *),
                        void (*item_free)(void *)) {
    char *path = path_in(run->dir, name), *bytes;
    size_t len;
    char *error = read_from(path, *read, TALLY_PERIODS_RUN_MAX_OUTPUT, &bytes, &len);
    free(path);
    if (error) return error;
    size_t complete = len;
    while (complete && bytes[complete - 1] != '\n') complete--;
    *read += (off_t)complete;
    size_t capacity = 0;
    for (size_t at = 0; at < complete && !error;) {
        size_t end = at;
        while (bytes[end] != '\n') end++;
        if (end > at) {
            if (*count == capacity) {
                capacity = capacity ? 2 * capacity : 8;
                *items = grown(*items, capacity * item_size); /* capacity ≤ 2 × lines ≤ the bounded size */
            }
            void *item = (char *)*items + *count * item_size;
            const char *wrong = read_line(bytes + at, end - at, item);
            tally_periods_done(); /* the decoded JSON's arena */
            if (wrong) {
                error = formatted("tally_periods_run: a line of %s %s: %.*s", name, wrong, (int)(end - at), bytes + at);
                item_free(item);
            } else {
                ++*count;
            }
        }
        at = end + 1;
    }
    free(bytes);
    return error;
}

static const char *read_record_line(const char *line, size_t len, void *item) { return read_record(line, len, item); }
static const char *read_dead_letter_line(const char *line, size_t len, void *item) {
    return read_dead_letter(line, len, item);
}
static void free_record_item(void *item) { record_free(item); }
static void free_dead_letter_item(void *item) {
    tally_periods_dead_letter *dead_letter = item;
    free(dead_letter->reason);
    *dead_letter = (tally_periods_dead_letter){0};
}

void tally_periods_sent_free(tally_periods_sent *sent) {
    for (size_t i = 0; i < sent->record_count; i++) record_free(&sent->records[i]);
    for (size_t i = 0; i < sent->dead_letter_count; i++) free_dead_letter_item(&sent->dead_letters[i]);
    free(sent->records);
    free(sent->dead_letters);
    free(sent->error);
    *sent = (tally_periods_sent){0};
}

static tally_periods_sent failed_send(tally_periods_sent *sent, char *error) {
    fprintf(stderr, "%s\n", error);
    tally_periods_sent_free(sent);
    sent->error = error;
    return *sent;
}

tally_periods_sent tally_periods_run_send(tally_periods_run *run, const char *const *lines, size_t count) {
    tally_periods_sent sent = {0};
    if (!run) return failed_send(&sent, formatted("tally_periods_run: a send without a run (did the start fail?)"));
    tally_text input = {0};
    for (size_t i = 0; i < count; i++) {
        if (strpbrk(lines[i], "\r\n")) {
            tally_text_free(&input);
            return failed_send(&sent, formatted("tally_periods_run: line %zu sent holds a line break: %s", i, lines[i]));
        }
        tally_text_str(&input, lines[i]);
        tally_text_str(&input, "\n");
    }
    char *path = path_in(run->dir, "events.ndjson");
    char *error = write_file(path, "ab", (const char *)input.bytes, input.len);
    free(path);
    tally_text_free(&input);
    if (!error) error = run_tally(run, run->dir, "run job.toml");
    if (!error) {
        /* Both read, whatever the first finds: the next send reads past them. */
        char *records = read_lines(run, "out/periods.ndjson", &run->periods_read, (void **)&sent.records,
                                   &sent.record_count, sizeof *sent.records, read_record_line, free_record_item);
        char *dead_letters =
            read_lines(run, "out/dead-letters.ndjson", &run->dead_letters_read, (void **)&sent.dead_letters,
                       &sent.dead_letter_count, sizeof *sent.dead_letters, read_dead_letter_line, free_dead_letter_item);
        error = records ? records : dead_letters;
        if (records) free(dead_letters);
    }
    if (error) return failed_send(&sent, error);
    sent.ok = true;
    return sent;
}
