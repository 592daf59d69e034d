//! Names that sync tools and desktops leave in a folder: the one list every front end asks.
//!
//! Why: a vault lives in a synced folder, and what a sync tool does there is normal life:
//! Syncthing keeps a marker (`.stfolder`), its ignore file, a version store and temporary
//! files while it receives; Dropbox, Nextcloud, Resilio, rclone and Google Drive keep their
//! own; file managers drop `.DS_Store`, `Thumbs.db` and `desktop.ini`. None of these is a
//! veilfs entry, and none is damage: the mount, `ls`, `export`, the crash sweep and fsck
//! leave them alone (fsck names them as foreign, exit code 0, and `--repair` never moves
//! them), and none of them descends into a sync tool's own directory (Syncthing's version
//! store holds old ciphertext under changed names).
//!
//! A vault on a FUSE file system (sshfs, for a vault on another machine) also meets that file
//! system's own files: a file deleted while still open is renamed to `.fuse_hidden<hex>` by
//! the FUSE library and removed on its last close. With `--shared-storage` over sshfs that is
//! common (a mount deletes a file whose last close reaches it a moment later), and such a file
//! is a deleted entry on its way out, not damage.
//!
//! A name is looked up here only after it failed to parse as anything veilfs writes, so no
//! pattern can hide a vault entry: veilfs names are base64url (no `.`, `~`, `!` or `$`) or
//! start with `veilfs.`. Everything else unknown stays an integrity finding.

/// One pattern: how a name matches and which tool leaves it.
struct Pattern {
    tool: &'static str,
    rule: Rule,
}

enum Rule {
    /// The whole name.
    Exact(&'static str),
    /// A prefix and a suffix (either may be empty), non-overlapping.
    Affix(&'static str, &'static str),
    /// A prefix, then the infix somewhere after it.
    PrefixThen(&'static str, &'static str),
    /// The infix anywhere.
    Contains(&'static str),
    /// A sync tool's copy of the vault lock file ([`crate::lock::is_conflict_copy`]).
    LockCopy,
}

/// The tool named for a copy of `veilfs.lock` (any sync tool's: the lock file has no content,
/// so a copy of it is as harmless as its original; see [`crate::lock`]).
pub const LOCK_COPY_TOOL: &str = "a sync tool (a copy of veilfs.lock, ignored)";

/// The list, by tool (docs/GUIDE.md "Synced folders" shows it to users).
const PATTERNS: &[Pattern] = &[
    Pattern { tool: "Syncthing", rule: Rule::Exact(".stfolder") },
    Pattern { tool: "Syncthing", rule: Rule::Exact(".stignore") },
    Pattern { tool: "Syncthing", rule: Rule::Exact(".stversions") },
    Pattern { tool: "Syncthing", rule: Rule::Affix(".syncthing.", ".tmp") },
    Pattern { tool: "Syncthing", rule: Rule::Affix("~syncthing~", ".tmp") },
    Pattern { tool: "Dropbox", rule: Rule::Affix(".dropbox", "") },
    Pattern { tool: "Nextcloud/ownCloud", rule: Rule::PrefixThen(".sync_", ".db") },
    Pattern { tool: "Nextcloud/ownCloud", rule: Rule::PrefixThen("._sync_", ".db") },
    Pattern { tool: "Nextcloud/ownCloud", rule: Rule::Exact(".owncloudsync.log") },
    Pattern { tool: "Nextcloud/ownCloud", rule: Rule::Exact(".nextcloudsync.log") },
    Pattern { tool: "Nextcloud/ownCloud", rule: Rule::Contains(".~") },
    Pattern { tool: "rclone", rule: Rule::Affix("", ".partial") },
    Pattern { tool: "Resilio Sync", rule: Rule::Exact(".sync") },
    Pattern { tool: "Resilio Sync", rule: Rule::Affix("", ".!sync") },
    Pattern { tool: "Google Drive", rule: Rule::Exact(".tmp.drivedownload") },
    Pattern { tool: "Google Drive", rule: Rule::Exact(".tmp.driveupload") },
    Pattern { tool: "Windows (OneDrive, Explorer)", rule: Rule::Exact("desktop.ini") },
    Pattern { tool: "Windows (OneDrive, Explorer)", rule: Rule::Exact("Thumbs.db") },
    Pattern { tool: "macOS Finder", rule: Rule::Exact(".DS_Store") },
    Pattern { tool: "macOS Finder", rule: Rule::Affix("._", "") },
    Pattern { tool: "KDE Dolphin", rule: Rule::Exact(".directory") },
    // `veilfs (1).lock`, `veilfs-HOST.lock`, `veilfs (… conflicted copy …).lock`; Syncthing's
    // `veilfs.sync-conflict-….lock` has the reserved prefix and fsck names it the same way.
    Pattern { tool: LOCK_COPY_TOOL, rule: Rule::LockCopy },
    Pattern { tool: "a FUSE file system (sshfs, …)", rule: Rule::Affix(".fuse_hidden", "") },
];

/// The tool that leaves a file named `name` in synced folders, if any.
pub fn sync_tool(name: &[u8]) -> Option<&'static str> {
    let name = std::str::from_utf8(name).ok()?;
    PATTERNS.iter().find(|p| matches(&p.rule, name)).map(|p| p.tool)
}

fn matches(rule: &Rule, name: &str) -> bool {
    match *rule {
        Rule::Exact(x) => name == x,
        Rule::Affix(pre, suf) => name.len() >= pre.len() + suf.len() && name.starts_with(pre) && name.ends_with(suf),
        Rule::PrefixThen(pre, inner) => name.strip_prefix(pre).is_some_and(|rest| rest.contains(inner)),
        Rule::Contains(inner) => name.contains(inner),
        Rule::LockCopy => crate::lock::is_conflict_copy(name.as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::ParsedEntry;

    /// One name per pattern, as each tool writes it, and the tool it is put down to.
    const SEEN: &[(&str, &str)] = &[
        (".stfolder", "Syncthing"),
        (".stignore", "Syncthing"),
        (".stversions", "Syncthing"),
        (".syncthing.veilfs.diriv.a3f0.tmp", "Syncthing"),
        (".syncthing.Zm9vYmFyYmF6cXV4cXV1eA.AAAAAAAAAAAAAAAAAAAAAA.tmp", "Syncthing"),
        ("~syncthing~Zm9vYmFy.tmp", "Syncthing"),
        (".dropbox", "Dropbox"),
        (".dropbox.attr", "Dropbox"),
        (".dropbox.cache", "Dropbox"),
        (".sync_1a2b3c4d5e6f.db", "Nextcloud/ownCloud"),
        (".sync_1a2b3c4d5e6f.db-wal", "Nextcloud/ownCloud"),
        ("._sync_1a2b3c4d5e6f.db-shm", "Nextcloud/ownCloud"),
        (".owncloudsync.log", "Nextcloud/ownCloud"),
        (".nextcloudsync.log", "Nextcloud/ownCloud"),
        (".Zm9vYmFyYmF6.~1a2b3c", "Nextcloud/ownCloud"),
        ("Zm9vYmFyYmF6cXV4.AAAA.1a2b3c4d.partial", "rclone"),
        (".sync", "Resilio Sync"),
        ("Zm9vYmFyYmF6cXV4.!sync", "Resilio Sync"),
        (".tmp.drivedownload", "Google Drive"),
        (".tmp.driveupload", "Google Drive"),
        ("desktop.ini", "Windows (OneDrive, Explorer)"),
        ("Thumbs.db", "Windows (OneDrive, Explorer)"),
        (".DS_Store", "macOS Finder"),
        ("._Zm9vYmFyYmF6cXV4", "macOS Finder"),
        (".directory", "KDE Dolphin"),
        ("veilfs (1).lock", LOCK_COPY_TOOL),
        ("veilfs (laptop's conflicted copy 2026-11-27).lock", LOCK_COPY_TOOL),
        ("veilfs-LAPTOP.lock", LOCK_COPY_TOOL),
        (".fuse_hidden0000002a00000001", "a FUSE file system (sshfs, …)"),
    ];

    #[test]
    fn each_tools_files_are_named_after_the_tool() {
        for (name, tool) in SEEN {
            assert_eq!(sync_tool(name.as_bytes()), Some(*tool), "{name}");
            assert!(matches!(ParsedEntry::parse(name.as_bytes()), ParsedEntry::SyncTool(t) if t == *tool), "{name}");
        }
        // Every pattern is exercised by at least one name above.
        for p in PATTERNS {
            assert!(SEEN.iter().any(|(n, _)| matches(&p.rule, n)), "a pattern of {} has no example", p.tool);
        }
    }

    #[test]
    fn no_name_veilfs_writes_is_taken_for_a_sync_tools_file() {
        let names = [
            "Zm9vYmFyYmF6cXV4cXV1eA.AAAAAAAAAAAAAAAAAAAAAA",
            "veilfs.conf",
            "veilfs.lock",
            "veilfs.diriv",
            "veilfs.L.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA",
        ];
        for n in names {
            assert!(!matches!(ParsedEntry::parse(n.as_bytes()), ParsedEntry::SyncTool(_)), "{n}");
        }
        // A sync tool's conflict copy of a veilfs entry is not one of its working files: it is
        // a copy of the entry ([`crate::conflict`]), verified as the entry is.
        let copy = "Zm9vYmFyYmF6cXV4cXV1eAbc.sync-conflict-20261127-101010-ABCDEFG.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
        assert!(sync_tool(copy.as_bytes()).is_none());
        assert!(matches!(ParsedEntry::parse(copy.as_bytes()), ParsedEntry::Conflict(_)));
        assert!(sync_tool(b"stfolder").is_none() && sync_tool(b"\xff.tmp").is_none());
    }
}
