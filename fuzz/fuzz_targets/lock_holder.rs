//! How a lock holder is named: `holder::parse_lock_line` of arbitrary text (the kernel's
//! `/proc/locks` and fdinfo `lock:` lines) and `holder::veilfs_command` of arbitrary bytes (a
//! process's `/proc/PID/cmdline`, which any process of the machine sets as it likes): never
//! panics; a parsed line has a hex device and a decimal inode; a named command is one of the
//! commands that take a lock, and describing such a holder (the text a refused command prints)
//! is one line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veilfs_core::holder::{parse_lock_line, veilfs_command, Holder};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines() {
        if let Some(l) = parse_lock_line(line) {
            assert!(line.contains(&format!(":{}", l.ino)), "{line:?} → {l:?}");
        }
    }
    if let Some(command) = veilfs_command(data) {
        assert!(!command.is_empty() && !command.contains(['\n', '\0']), "{command:?}");
        let h = Holder { pid: 1, host: "h".into(), command, program: String::from_utf8_lossy(data).into_owned() };
        let said = h.describe();
        assert!(!said.is_empty() && !said.contains('\n'), "{said:?}");
    }
});
