;; Tally's closed `wasi_snapshot_preview1`: what the Go runtime imports,
;; answered inside the component, so a Go plugin imports nothing but
;; `tally:plugin`. It gives no arguments, no environment and no files;
;; stdout and stderr go to the host's log (which labels and rate-limits
;; them); the wall clock reads the time the SDK hands over from the batch
;; (its first event's timestamp), the monotonic clock ticks from there one
;; microsecond a read; random bytes come from a generator the SDK seeds
;; with the batch's input position. A re-run of the same input so reads the
;; same time and the same randomness. Sleeping (poll_oneoff), exiting and
;; raising signals trap. No data or element segments: wit-component requires that of an
;; adapter.
(module
  (import "env" "memory" (memory 0))
  (import "tally:plugin/log@0.1.0" "log" (func $log (param i32 i32 i32)))

  (global $wall (mut i64) (i64.const 0))      ;; ns since the epoch
  (global $ticks (mut i64) (i64.const 1))     ;; the Go runtime aborts on a monotonic 0
  (global $random (mut i64) (i64.const 0x243f6a8885a308d3))

  (func (export "tally_set_time") (param $ns i64)
    (global.set $wall (local.get $ns)))
  (func (export "tally_seed") (param $seed i64)
    (global.set $random (i64.xor (local.get $seed) (i64.const 0x243f6a8885a308d3))))

  (func (export "args_get") (param i32 i32) (result i32) (i32.const 0))
  (func (export "args_sizes_get") (param $count i32) (param $size i32) (result i32)
    (i32.store (local.get $count) (i32.const 0))
    (i32.store (local.get $size) (i32.const 0))
    (i32.const 0))
  (func (export "environ_get") (param i32 i32) (result i32) (i32.const 0))
  (func (export "environ_sizes_get") (param $count i32) (param $size i32) (result i32)
    (i32.store (local.get $count) (i32.const 0))
    (i32.store (local.get $size) (i32.const 0))
    (i32.const 0))

  ;; Realtime (0) is the batch's time; every other clock ticks.
  (func (export "clock_time_get") (param $id i32) (param i64) (param $out i32) (result i32)
    (if (i32.eqz (local.get $id))
      (then (i64.store (local.get $out) (i64.add (global.get $wall) (global.get $ticks))))
      (else (i64.store (local.get $out) (global.get $ticks))))
    (global.set $ticks (i64.add (global.get $ticks) (i64.const 1000)))
    (i32.const 0))
  (func (export "adapter_monotonic_clock_set_paused") (param i32))

  ;; splitmix64, one step per 8 bytes.
  (func $next (result i64)
    (local $z i64)
    (global.set $random (i64.add (global.get $random) (i64.const 0x9e3779b97f4a7c15)))
    (local.set $z (global.get $random))
    (local.set $z (i64.mul (i64.xor (local.get $z) (i64.shr_u (local.get $z) (i64.const 30))) (i64.const 0xbf58476d1ce4e5b9)))
    (local.set $z (i64.mul (i64.xor (local.get $z) (i64.shr_u (local.get $z) (i64.const 27))) (i64.const 0x94d049bb133111eb)))
    (i64.xor (local.get $z) (i64.shr_u (local.get $z) (i64.const 31))))
  (func (export "random_get") (param $buf i32) (param $len i32) (result i32)
    (local $word i64) (local $i i32)
    (block $done
      (loop $fill
        (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
        (if (i32.eqz (i32.and (local.get $i) (i32.const 7))) (then (local.set $word (call $next))))
        (i32.store8 (i32.add (local.get $buf) (local.get $i)) (i32.wrap_i64 (local.get $word)))
        (local.set $word (i64.shr_u (local.get $word) (i64.const 8)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $fill)))
    (i32.const 0))

  ;; The length of the longest UTF-8 prefix of [ptr, ptr+len) (the log
  ;; takes text; what follows a bad byte is dropped).
  (func $utf8_prefix (param $ptr i32) (param $len i32) (result i32)
    (local $i i32) (local $c i32) (local $n i32) (local $k i32)
    (block $stop
      (loop $scan
        (br_if $stop (i32.ge_u (local.get $i) (local.get $len)))
        (local.set $c (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
        (local.set $n
          (if (result i32) (i32.lt_u (local.get $c) (i32.const 0x80)) (then (i32.const 0))
          (else (if (result i32) (i32.and (i32.ge_u (local.get $c) (i32.const 0xc2)) (i32.le_u (local.get $c) (i32.const 0xdf))) (then (i32.const 1))
          (else (if (result i32) (i32.and (i32.ge_u (local.get $c) (i32.const 0xe0)) (i32.le_u (local.get $c) (i32.const 0xef))) (then (i32.const 2))
          (else (if (result i32) (i32.and (i32.ge_u (local.get $c) (i32.const 0xf0)) (i32.le_u (local.get $c) (i32.const 0xf4))) (then (i32.const 3))
          (else (br $stop))))))))))
        (br_if $stop (i32.gt_u (i32.add (i32.add (local.get $i) (local.get $n)) (i32.const 1)) (local.get $len)))
        ;; Continuation bytes; shortest forms, no surrogates, nothing past U+10FFFF.
        (local.set $k (i32.const 1))
        (block $checked
          (loop $continue
            (br_if $checked (i32.gt_u (local.get $k) (local.get $n)))
            (br_if $stop (i32.ne (i32.and (i32.load8_u (i32.add (local.get $ptr) (i32.add (local.get $i) (local.get $k)))) (i32.const 0xc0)) (i32.const 0x80)))
            (local.set $k (i32.add (local.get $k) (i32.const 1)))
            (br $continue)))
        (if (i32.gt_u (local.get $n) (i32.const 1))
          (then
            (local.set $k (i32.load8_u (i32.add (local.get $ptr) (i32.add (local.get $i) (i32.const 1)))))
            (br_if $stop (i32.and (i32.eq (local.get $c) (i32.const 0xe0)) (i32.lt_u (local.get $k) (i32.const 0xa0))))
            (br_if $stop (i32.and (i32.eq (local.get $c) (i32.const 0xed)) (i32.gt_u (local.get $k) (i32.const 0x9f))))
            (br_if $stop (i32.and (i32.eq (local.get $c) (i32.const 0xf0)) (i32.lt_u (local.get $k) (i32.const 0x90))))
            (br_if $stop (i32.and (i32.eq (local.get $c) (i32.const 0xf4)) (i32.gt_u (local.get $k) (i32.const 0x8f))))))
        (local.set $i (i32.add (local.get $i) (i32.add (local.get $n) (i32.const 1))))
        (br $scan)))
    (local.get $i))

  ;; stdout (1) at info, stderr (2) at warn, a line per write without its
  ;; final newline; every other descriptor is closed (EBADF, 8).
  (func (export "fd_write") (param $fd i32) (param $iovs i32) (param $count i32) (param $written i32) (result i32)
    (local $i i32) (local $ptr i32) (local $len i32) (local $total i32) (local $text i32)
    (if (i32.and (i32.ne (local.get $fd) (i32.const 1)) (i32.ne (local.get $fd) (i32.const 2))) (then (return (i32.const 8))))
    (block $done
      (loop $each
        (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
        (local.set $ptr (i32.load (i32.add (local.get $iovs) (i32.mul (local.get $i) (i32.const 8)))))
        (local.set $len (i32.load (i32.add (i32.add (local.get $iovs) (i32.mul (local.get $i) (i32.const 8))) (i32.const 4))))
        (local.set $total (i32.add (local.get $total) (local.get $len)))
        (local.set $text (call $utf8_prefix (local.get $ptr) (local.get $len)))
        (if (i32.and (i32.gt_u (local.get $text) (i32.const 0))
                     (i32.eq (i32.load8_u (i32.add (local.get $ptr) (i32.sub (local.get $text) (i32.const 1)))) (i32.const 10)))
          (then (local.set $text (i32.sub (local.get $text) (i32.const 1)))))
        (if (i32.gt_u (local.get $text) (i32.const 0))
          (then (call $log (if (result i32) (i32.eq (local.get $fd) (i32.const 1)) (then (i32.const 2)) (else (i32.const 3)))
                           (local.get $ptr) (local.get $text))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $each)))
    (i32.store (local.get $written) (local.get $total))
    (i32.const 0))

  ;; stdin, stdout and stderr are character devices; there is nothing else.
  (func (export "fd_fdstat_get") (param $fd i32) (param $out i32) (result i32)
    (if (i32.gt_u (local.get $fd) (i32.const 2)) (then (return (i32.const 8))))
    (i64.store (local.get $out) (i64.const 2))
    (i64.store (i32.add (local.get $out) (i32.const 8)) (i64.const 0))
    (i64.store (i32.add (local.get $out) (i32.const 16)) (i64.const 0))
    (i32.const 0))
  (func (export "fd_fdstat_set_flags") (param $fd i32) (param i32) (result i32)
    (if (result i32) (i32.gt_u (local.get $fd) (i32.const 2)) (then (i32.const 8)) (else (i32.const 0))))
  (func (export "fd_close") (param i32) (result i32) (i32.const 8))
  (func (export "fd_prestat_get") (param i32 i32) (result i32) (i32.const 8))
  (func (export "fd_prestat_dir_name") (param i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sched_yield") (result i32) (i32.const 0))
  ;; stdin is empty; every other descriptor, file and socket call finds no
  ;; such descriptor (EBADF, 8): there are no preopened directories.
  (func (export "fd_read") (param $fd i32) (param i32 i32) (param $read i32) (result i32)
    (if (i32.ne (local.get $fd) (i32.const 0)) (then (return (i32.const 8))))
    (i32.store (local.get $read) (i32.const 0))
    (i32.const 0))
  (func (export "clock_res_get") (param i32) (param $out i32) (result i32)
    (i64.store (local.get $out) (i64.const 1000))
    (i32.const 0))
  (func (export "fd_advise") (param i32 i64 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_allocate") (param i32 i64 i64) (result i32) (i32.const 8))
  (func (export "fd_datasync") (param i32) (result i32) (i32.const 8))
  (func (export "fd_sync") (param i32) (result i32) (i32.const 8))
  (func (export "fd_filestat_get") (param i32 i32) (result i32) (i32.const 8))
  (func (export "fd_filestat_set_size") (param i32 i64) (result i32) (i32.const 8))
  (func (export "fd_filestat_set_times") (param i32 i64 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_fdstat_set_rights") (param i32 i64 i64) (result i32) (i32.const 8))
  (func (export "fd_pread") (param i32 i32 i32 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_pwrite") (param i32 i32 i32 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_readdir") (param i32 i32 i32 i64 i32) (result i32) (i32.const 8))
  (func (export "fd_renumber") (param i32 i32) (result i32) (i32.const 8))
  (func (export "fd_seek") (param i32 i64 i32 i32) (result i32) (i32.const 8))
  (func (export "fd_tell") (param i32 i32) (result i32) (i32.const 8))
  (func (export "path_create_directory") (param i32 i32 i32) (result i32) (i32.const 8))
  (func (export "path_filestat_get") (param i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "path_filestat_set_times") (param i32 i32 i32 i32 i64 i64 i32) (result i32) (i32.const 8))
  (func (export "path_link") (param i32 i32 i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "path_open") (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32) (i32.const 8))
  (func (export "path_readlink") (param i32 i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "path_remove_directory") (param i32 i32 i32) (result i32) (i32.const 8))
  (func (export "path_rename") (param i32 i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "path_symlink") (param i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "path_unlink_file") (param i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sock_accept") (param i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sock_recv") (param i32 i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sock_send") (param i32 i32 i32 i32 i32) (result i32) (i32.const 8))
  (func (export "sock_shutdown") (param i32 i32) (result i32) (i32.const 8))
  (func (export "proc_raise") (param i32) (result i32) (unreachable))
  (func (export "poll_oneoff") (param i32 i32 i32 i32) (result i32) (unreachable))
  (func (export "proc_exit") (param i32) (unreachable))
)
