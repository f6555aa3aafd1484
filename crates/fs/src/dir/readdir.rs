//! Readdir of hashed directories in hash order, leaf by leaf, with the positions the cookies
//! name (see the module documentation of `dir`).

use super::*;

impl<'a> Dir<'a> {
    pub(super) fn visit_leaf(&mut self, path: &Path, visited: &mut HashSet<u32>) -> Result<u32> {
        let lblk = path.leaf();
        if !visited.insert(lblk) {
            return Err(self.corrupted(lblk, "leaf referenced twice by the index"));
        }
        Ok(lblk)
    }

    pub(super) fn read_hashed(
        &mut self,
        start: u64,
        want: usize,
        must_progress: bool,
    ) -> Result<Vec<DirEntryInfo>> {
        if start > HASH_POSITION_MAX {
            return Ok(Vec::new());
        }
        // Entries with a position below `complete_below` have all been collected.
        let (mut found, complete_below) = if self.indexed() {
            self.collect_hashed_htree(start, want)?
        } else {
            let data = self.read_leaf(0)?;
            let mut found = Vec::new();
            for entry in self.linear_entries(0, &data)? {
                let (major, minor) = self.hash(entry.name, self.ctx.hash_version)?;
                found.push((hash_position(major, minor), entry_info(&entry)));
            }
            (found, u64::MAX)
        };
        found.retain(|(position, _)| *position >= start && *position < complete_below);
        found.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let mut out = Vec::new();
        let mut i = 0;
        while i < found.len() && out.len() < want {
            let position = found[i].0;
            let group = found[i..].iter().take_while(|(p, _)| *p == position).count();
            if out.len() + group > want && !(out.is_empty() && must_progress) {
                break;
            }
            let next_cookie = position + 1 + COOKIE_POSITION_BASE;
            out.extend(
                found[i..i + group].iter().map(|(_, e)| DirEntryInfo { next_cookie, ..e.clone() }),
            );
            i += group;
        }
        Ok(out)
    }

    pub(super) fn collect_hashed_htree(
        &mut self,
        start: u64,
        want: usize,
    ) -> Result<(Vec<(u64, DirEntryInfo)>, u64)> {
        let start_hash = ((start >> 32) as u32) << 1;
        let (root, version) = self.read_root()?;
        let mut path = self.descend(root, version, Some(start_hash))?;
        let mut visited = HashSet::new();
        let mut found = Vec::new();
        loop {
            let lblk = self.visit_leaf(&path, &mut visited)?;
            let data = self.read_leaf(lblk)?;
            for entry in self.leaf_live(lblk, &data)? {
                let (major, minor) = self.hash(entry.name, version)?;
                let position = hash_position(major, minor);
                if position >= start {
                    found.push((position, entry_info(&entry)));
                }
            }
            let Some(next_hash) = self.next_leaf(&mut path, None)? else {
                return Ok((found, u64::MAX));
            };
            let bound = hash_position(next_hash & !DX_HASH_CONTINUED, 0);
            if found.iter().filter(|(position, _)| *position < bound).count() >= want {
                return Ok((found, bound));
            }
        }
    }
}
