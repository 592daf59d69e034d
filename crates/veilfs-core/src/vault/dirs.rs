//! Reading the tree: a directory's IV copy (checked, restored, rewritten), its listing and
//! lookups (entry names decoded, bindings verified, long names read from their side files,
//! conflict copies recognised), opening subdirectories, and vault paths resolved, encrypted
//! and decrypted component by component.

use super::*;
use std::collections::HashSet;

impl Vault {
    /// Opens the top directory and checks its IV copy against the config.
    pub fn root(&self) -> Result<CipherDir> {
        let dir = self.root_dir()?;
        self.check_diriv(&dir)?;
        Ok(dir)
    }

    /// Opens the top directory without checking its IV copy (fsck checks it itself).
    pub fn root_dir(&self) -> Result<CipherDir> {
        let fd = sys::open_dir_path(&self.root_path).ctx(|| format!("opening {}", self.root_path.display()))?;
        let iv = self.config.root_iv().expect("checked at load");
        Ok(CipherDir { fd, iv, path: self.root_path.clone() })
    }

    /// Checks that `dir`'s IV copy (F§7.1) names the IV its entry promises. A missing (or, in
    /// the old form, empty) copy is not an error and is not written here: the IV comes from
    /// the authenticated entry, and opening a directory is a read. In a synced folder the copy
    /// may simply not have arrived yet, and a reader that wrote it would race the sync tool
    /// delivering it (the tool then sees a file it did not write, and the folder a change
    /// nobody made). `mkdir` writes the copy before the directory gets its name, so no crash
    /// leaves one missing; `fsck --repair` restores it.
    pub fn check_diriv(&self, dir: &CipherDir) -> Result<()> {
        if !self.verify_diriv(dir)? {
            tracing::debug!("{}: no IV copy (yet); using the IV of its entry", dir.path.display());
        }
        Ok(())
    }

    /// Whether `dir`'s IV copy names the IV its entry promises (`Ok(false)`: missing, or an
    /// empty `veilfs.diriv`). A copy of another directory's IV, a damaged one and anything but
    /// a regular file there (a planted FIFO, directory or symlink) is an integrity error
    /// naming it. Never writes.
    pub fn verify_diriv(&self, dir: &CipherDir) -> Result<bool> {
        self.iv_copy.verify(dir.fd(), &dir.iv, &dir.path)
    }

    /// Writes `dir`'s missing IV copy from the IV its authenticated entry promises.
    pub fn restore_diriv(&self, dir: &CipherDir) -> Result<()> {
        let name = self.iv_copy.name(&dir.iv);
        tracing::warn!("{} is missing; restoring it from the directory's entry", dir.child_path(&name));
        if self.iv_copy == IvCopy::File {
            // An empty one (a crash between creating and writing it).
            let _ = sys::unlinkat(dir.fd(), name.as_bytes(), false);
        }
        self.iv_copy.write(dir.fd(), &dir.iv).ctx(|| format!("writing {}", dir.child_path(&name)))
    }

    /// Replaces a damaged or copied IV copy of `dir` (of a subdirectory: the top one's IV is
    /// in the config) with the IV its authenticated entry promises; a directory planted there
    /// is moved aside under a temporary name, never deleted.
    pub fn rewrite_diriv(&self, dir: &CipherDir) -> Result<()> {
        self.iv_copy.rewrite(dir.fd(), &dir.iv, &dir.path)
    }

    /// The vault's `lost+found` directory (made on first use).
    pub fn lost_found(&self) -> Result<CipherDir> {
        let root = self.root()?;
        match self.lookup(&root, crate::names::LOST_FOUND)? {
            Some(e) => self.open_dir(&root, &e),
            None => Ok(self.mkdir_unchecked(&root, crate::names::LOST_FOUND, 0o700)?.1),
        }
    }

    /// Reads the long-name side file `side` of `dir`. Missing, oversized or not a regular
    /// file: an integrity error naming it (the entry that needs it cannot be decoded).
    pub fn read_side_file(dir: &CipherDir, side: &str) -> Result<Vec<u8>> {
        match sys::read_meta_at(dir.fd(), side.as_bytes(), SIDE_FILE_MAX) {
            Ok(b) => Ok(b),
            Err(e) if e.is_not_found() => {
                Err(Error::auth(dir.child_path(side), "is missing (the long name of an entry cannot be read)"))
            }
            Err(MetaError::Io(e)) => Err(Error::io(dir.child_path(side), e)),
            Err(e) => Err(Error::auth(dir.child_path(side), e.to_string())),
        }
    }

    /// Decodes one raw on-disk entry of `dir` (`st` = its backing stat).
    pub fn decode_entry(&self, dir: &CipherDir, on_disk: &[u8], st: Stat) -> Result<Option<Entry>> {
        let parsed = ParsedEntry::parse(on_disk);
        let what = || dir.child_path(&String::from_utf8_lossy(on_disk));
        match parsed {
            // A conflict copy is decoded with the directory's other copies
            // ([`list_conflicts`](Self::list_conflicts)), which give it its shown name.
            ParsedEntry::Internal | ParsedEntry::SyncTool(_) | ParsedEntry::Conflict(_) => return Ok(None),
            ParsedEntry::Foreign => return Err(Error::auth(what(), "is not a veilfs entry name")),
            _ => {}
        }
        let d = self.names.entry_d(&parsed, |side| Self::read_side_file(dir, side)).map_err(|e| relabel(e, &what()))?;
        let name = self.names.decrypt_name(&dir.iv, &d).map_err(|e| relabel(e, &what()))?;
        let (kind, identity) = self
            .verified_identity(&dir.iv, &d, parsed.binding().expect("user entry"), &st)
            .map_err(|e| relabel(e, &what()))?;
        let key = NameCipher::key_for_d(d);
        Ok(Some(Entry { name, on_disk: String::from_utf8_lossy(on_disk).into_owned(), key, kind, identity, stat: st }))
    }

    /// The user entries of `dir` by lookup key, without decrypting anything: (key, on-disk
    /// name, `d_type`) for each, in listing order. Names that are not veilfs entries (a sync
    /// tool's conflict copy) are left out with a warning naming them; a sync tool's own files
    /// ([`crate::foreign`]) silently. For callers that keep their own index (the mount).
    pub fn keyed_entries(dir: &CipherDir) -> Result<Vec<(String, String, u8)>> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        Ok(Self::keyed_from(dir, raw))
    }

    /// [`keyed_entries`](Self::keyed_entries) of an already read listing `raw` of `dir`.
    pub fn keyed_from(dir: &CipherDir, raw: Vec<sys::RawDirEntry>) -> Vec<(String, String, u8)> {
        let mut out = Vec::with_capacity(raw.len());
        for r in raw {
            let parsed = ParsedEntry::parse(&r.name);
            let Some(key) = parsed.key() else {
                if matches!(parsed, ParsedEntry::Foreign) {
                    tracing::warn!(
                        "{}: ignoring {:?}, which is not a veilfs entry (a sync conflict copy?)",
                        dir.path.display(),
                        String::from_utf8_lossy(&r.name)
                    );
                }
                continue;
            };
            let key = key.to_string();
            // Entry names parse only as UTF-8, so this moves the bytes without a copy.
            let on_disk =
                String::from_utf8(r.name).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            out.push((key, on_disk, r.d_type));
        }
        out
    }

    /// Opens the subdirectory `on_disk` of `parent` whose entry promises IV `iv`, checking its
    /// IV copy (see [`check_diriv`](Self::check_diriv)).
    pub fn open_subdir(&self, parent: &CipherDir, on_disk: &str, iv: DirIv) -> Result<CipherDir> {
        owner_access(parent, on_disk, || {
            let fd = sys::open_dir_at(parent.fd(), on_disk.as_bytes()).ctx(|| parent.child_path(on_disk))?;
            let dir = CipherDir { fd, iv, path: parent.path.join(on_disk) };
            self.check_diriv(&dir)?;
            Ok(dir)
        })
    }

    /// Lists `dir`: its decrypted entries, and the on-disk entries that failed to decrypt
    /// (logged; never shown as garbage names). Conflict copies that verify are entries under
    /// their shown names ([`crate::conflict`]).
    pub fn list(&self, dir: &CipherDir) -> Result<(Vec<Entry>, Vec<BadEntry>)> {
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let (mut good, mut bad): (Vec<Entry>, Vec<BadEntry>) = (Vec::new(), Vec::new());
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut failed: HashSet<&[u8]> = HashSet::new();
        for r in &raw {
            if matches!(ParsedEntry::parse(&r.name), ParsedEntry::Internal | ParsedEntry::SyncTool(_)) {
                continue;
            }
            let st = match Self::stat_entry(dir, &r.name) {
                Ok(st) => st,
                Err(error) => {
                    bad.push(BadEntry { on_disk: r.name.clone(), error });
                    continue;
                }
            };
            match self.decode_entry(dir, &r.name, st) {
                Ok(Some(e)) => match seen.get(&e.key.key) {
                    // Two entries for one name: made on two machines of a synced vault, or
                    // left by a crash in the middle of a rename over an existing name. The
                    // newer one (ctime) is the entry; the other is shown as a conflict copy.
                    Some(&i) => {
                        if ctime(&e.stat) > ctime(&good[i].stat) {
                            good[i] = e;
                        }
                    }
                    None => {
                        seen.insert(e.key.key.clone(), good.len());
                        good.push(e);
                    }
                },
                Ok(None) => {}
                Err(error) => {
                    failed.insert(&r.name);
                    bad.push(BadEntry { on_disk: r.name.clone(), error });
                }
            }
        }
        // A short entry whose name did not decrypt may be a copy whose tool's part is
        // base64url (OneDrive's `-HOST`): the copies' pass tries it, from what was found here.
        let (copies, bad_copies) =
            self.conflicts_among(dir, raw.iter().map(|r| r.name.as_slice()), |n| failed.contains(n.as_bytes()));
        let copied: HashSet<&[u8]> = copies.iter().map(|c| c.entry.on_disk.as_bytes()).collect();
        bad.retain(|b| !copied.contains(b.on_disk.as_slice()));
        for b in bad.iter().filter(|b| failed.contains(b.on_disk.as_slice())) {
            tracing::error!("{}", b.error);
        }
        good.extend(copies.into_iter().map(|c| c.entry));
        bad.extend(bad_copies);
        // What this client remembers of the directory: a deletion by a non-client is a finding
        // on the directory (the entry is not there to refuse; the rest of the listing is
        // fine), a resurrected entry is refused.
        let v = self.check_entries(dir, raw.iter().map(|r| r.name.as_slice()));
        if !v.resurrected.is_empty() {
            good.retain(|e| !v.resurrected.contains(&e.on_disk));
        }
        bad.extend(Self::verdict_errors(dir, &v));
        Ok((good, bad))
    }

    /// Finds the entry for plaintext `name` in `dir` (lists the directory). `D` is computed
    /// from the name, so a long name's side file is not needed (only listings read it), and
    /// the entry's binding is verified against that `D`: a forged entry cannot hide the real
    /// one, and among entries that verify, the newer (ctime) wins.
    pub fn lookup(&self, dir: &CipherDir, name: &[u8]) -> Result<Option<Entry>> {
        let key = self.names.name_key(&dir.iv, name)?;
        let raw = sys::read_dir_fd(dir.fd()).ctx(|| format!("listing {}", dir.path.display()))?;
        let mut found: Option<Entry> = None;
        let mut forged: Option<Error> = None;
        for r in &raw {
            let parsed = ParsedEntry::parse(&r.name);
            if parsed.key() != Some(key.key.as_str()) {
                continue;
            }
            let on_disk = String::from_utf8_lossy(&r.name).into_owned();
            let st = Self::stat_entry(dir, &r.name)?;
            let binding = parsed.binding().expect("user entry");
            let (kind, identity) = match self.verified_identity(&dir.iv, &key.d, binding, &st) {
                Ok(found) => found,
                Err(e) => {
                    forged = Some(relabel(e, &dir.child_path(&on_disk)));
                    continue;
                }
            };
            if found.as_ref().is_none_or(|f| ctime(&st) > ctime(&f.stat)) {
                found = Some(Entry { name: name.to_vec(), on_disk, key: key.clone(), kind, identity, stat: st });
            }
        }
        match (found, forged) {
            (Some(e), _) => {
                if self.has_tombstone(dir, &e.on_disk, &raw) {
                    return Err(Self::resurrected_error(dir, &e.on_disk));
                }
                Ok(Some(e))
            }
            (None, Some(e)) => Err(e),
            // Perhaps the name a conflict copy is shown under.
            (None, None) => self.lookup_conflict(dir, name, raw.iter().map(|r| r.name.as_slice())),
        }
    }

    /// Opens the subdirectory named by `entry` in `parent`, verifying its IV.
    pub fn open_dir(&self, parent: &CipherDir, entry: &Entry) -> Result<CipherDir> {
        if entry.kind != EntryKind::Dir {
            return Err(Error::io(parent.child_path(&entry.on_disk), std::io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        self.open_subdir(parent, &entry.on_disk, entry.identity)
    }

    /// Resolves a plaintext path relative to the vault root to its parent directory and
    /// entry (`None` entry = the root itself, or a missing last component).
    pub fn resolve(&self, path: &Path) -> Result<(CipherDir, Option<Entry>)> {
        let mut dir = self.root()?;
        let comps: Vec<&[u8]> = path_components(path)?;
        let Some((last, parents)) = comps.split_last() else {
            return Ok((dir, None));
        };
        for c in parents {
            let e = self.lookup(&dir, c)?.ok_or_else(|| not_found(path))?;
            dir = self.open_dir(&dir, &e)?;
        }
        let e = self.lookup(&dir, last)?;
        Ok((dir, e))
    }

    /// The ciphertext path (relative to the vault) of an existing plaintext path.
    pub fn encrypt_path(&self, path: &Path) -> Result<PathBuf> {
        let (dir, entry) = self.resolve(path)?;
        let rel = dir.path.strip_prefix(&self.root_path).unwrap_or(Path::new("")).to_path_buf();
        match entry {
            Some(e) => Ok(rel.join(e.on_disk)),
            None if path_components(path)?.is_empty() => Ok(rel),
            None => Err(not_found(path)),
        }
    }

    /// The plaintext path of a ciphertext path relative to the vault.
    pub fn decrypt_path(&self, cipher_path: &Path) -> Result<PathBuf> {
        let mut dir = self.root()?;
        let mut out = PathBuf::new();
        let comps = path_components(cipher_path)?;
        for (i, c) in comps.iter().enumerate() {
            let st = sys::fstatat(dir.fd(), c).ctx(|| dir.child_path(&String::from_utf8_lossy(c)))?;
            let e = self.decode_entry(&dir, c, st)?.ok_or_else(|| {
                Error::Invalid(format!("{} is a file of the vault itself", String::from_utf8_lossy(c)))
            })?;
            out.push(std::ffi::OsStr::from_bytes(&e.name));
            if i + 1 < comps.len() {
                dir = self.open_dir(&dir, &e)?;
            }
        }
        Ok(out)
    }
}
