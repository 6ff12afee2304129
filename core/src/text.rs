//! Text the host keeps or shows from plugins and tenants: one bound on a
//! reason's length, cutting at a character boundary, and making a text one
//! safe line. A leaf of the crate: it depends on nothing else in it.

/// Longest reason (a plugin's failure, rejection or error) the host keeps
/// or shows, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on
/// a character boundary.
pub fn prefix(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to at most `max_bytes` (at a character boundary), saying how
/// much was cut.
pub fn cut(text: &str, max_bytes: usize) -> String {
    let kept = prefix(text, max_bytes);
    if kept.len() == text.len() {
        return text.to_string();
    }
    format!("{kept} … ({} more bytes cut)", text.len() - kept.len())
}

/// `text` cut to at most `max_bytes` (at a character boundary, saying how
/// much was cut) with every control character escaped (`\n`, `\u{1b}`),
/// and the characters that break or reorder lines too (line and paragraph
/// separators, bidirectional controls, zero-width marks), so a plugin's
/// text is one line and cannot paint or forge others.
pub fn sanitize(text: &str, max_bytes: usize) -> String {
    let kept = prefix(text, max_bytes);
    let mut line = String::with_capacity(kept.len() + 16);
    for c in kept.chars() {
        let breaks_lines = matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        );
        if breaks_lines {
            line.extend(c.escape_unicode());
        } else if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    if kept.len() < text.len() {
        line.push_str(&format!(" … ({} more bytes cut)", text.len() - kept.len()));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_a_character_boundary_and_escaped_to_one_line() {
        assert_eq!(
            sanitize("ok\n2026-12-01T00:00:00Z  INFO tally_host: forged\r\x1b[2J", 1024),
            "ok\\n2026-12-01T00:00:00Z  INFO tally_host: forged\\r\\u{1b}[2J"
        );
        assert_eq!(sanitize("héllo", 2), "h … (5 more bytes cut)", "cut at a character boundary");
        assert_eq!(
            sanitize("a\u{2028}b\u{202E}c", 64),
            "a\\u{2028}b\\u{202e}c",
            "no line breaks or reordering"
        );
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("héllo", 64), "héllo");
        assert_eq!(cut("héllo", 3), "hé … (3 more bytes cut)");
        assert_eq!(cut("héllo", 6), "héllo");
    }
}
