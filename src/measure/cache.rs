//! Profiles kept between runs: `$XDG_CACHE_HOME/pipette-run/profiles/<key>.json` (or
//! `~/.cache/...`), one `pipette-cluster/1` file per set of hosts and GPU inventory.
//!
//! Two kinds of entry. The links entry's key is a hash of the sorted host names and what
//! the inventory found on each (GPU models, memory, PCI addresses; or the CPU stand-ins):
//! it holds the links and matmul figures, so the same nodes with the same GPUs reuse them
//! in any order, and a node whose GPUs changed is measured again. A sweep entry's key adds
//! the performance sweep asked for (its shapes, sizes and budget): it holds the whole
//! profile with that sweep's section, so another model on the same nodes measures only its
//! own sweep and reuses the links entry. An entry older than the time-to-live (by file
//! modification time) is measured again.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::cluster::ClusterProfile;

/// The cache directory under the user's cache home.
pub const CACHE_SUBDIR: &str = "pipette-run/profiles";

/// Where cached profiles live, and for how long they count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileCache {
    pub dir: PathBuf,
    pub ttl: Duration,
}

/// Why the cache could not be written (never fatal: the profile is still returned).
#[derive(Debug, thiserror::Error)]
#[error("cannot write the profile cache {}: {source} (check the directory's permissions, or set XDG_CACHE_HOME)", .path.display())]
pub struct CacheError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// A profile for these nodes, `age` old.
    Fresh {
        profile: Box<ClusterProfile>,
        path: PathBuf,
        age: Duration,
    },
    /// A profile older than the time-to-live.
    Stale {
        path: PathBuf,
        age: Duration,
    },
    /// A file that does not read as a profile (ignored, and replaced on the next store).
    Unreadable {
        path: PathBuf,
        reason: String,
    },
    Missing,
}

impl ProfileCache {
    /// `$XDG_CACHE_HOME/pipette-run/profiles` (when set and absolute), else
    /// `$HOME/.cache/pipette-run/profiles`; `None` when neither is known.
    pub fn default_dir() -> Option<PathBuf> {
        Self::dir_from(
            std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
            std::env::var_os("HOME").map(PathBuf::from),
        )
    }

    fn dir_from(xdg: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
        let base = match xdg.filter(|p| p.is_absolute()) {
            Some(xdg) => xdg,
            None => home.filter(|p| p.is_absolute())?.join(".cache"),
        };
        Some(base.join(CACHE_SUBDIR))
    }

    /// The file for `key`.
    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// The cached profile for `key`, if any, as of `now`.
    pub fn lookup(&self, key: &str, now: SystemTime) -> Lookup {
        let path = self.path(key);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Lookup::Missing;
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        if age > self.ttl {
            return Lookup::Stale { path, age };
        }
        match ClusterProfile::load(&path) {
            Ok(profile) => Lookup::Fresh {
                profile: Box::new(profile),
                path,
                age,
            },
            Err(e) => Lookup::Unreadable {
                path,
                reason: e.to_string(),
            },
        }
    }

    /// Writes `profile` for `key` (atomically: a temporary file renamed into place).
    pub fn store(&self, key: &str, profile: &ClusterProfile) -> Result<PathBuf, CacheError> {
        let path = self.path(key);
        let fail = |source| CacheError {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(fail)?;
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, profile.to_json_pretty()).map_err(fail)?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            fail(e)
        })?;
        Ok(path)
    }
}

/// The cache key of a canonical description: 16 hex digits of its 64-bit FNV-1a hash.
/// (Not cryptographic: the key only has to tell inventories apart, and a collision merely
/// reuses a profile whose hosts are then checked.)
pub fn key_of(canonical: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::profile::GpuInventory;
    use crate::cluster::profile::{LinkMatrix, NodeProfile, Provenance, Source};

    #[test]
    fn cache_dir_follows_xdg_then_home() {
        assert_eq!(
            ProfileCache::dir_from(Some("/x".into()), Some("/home/u".into())),
            Some(PathBuf::from("/x/pipette-run/profiles"))
        );
        assert_eq!(
            ProfileCache::dir_from(Some("relative".into()), Some("/home/u".into())),
            Some(PathBuf::from("/home/u/.cache/pipette-run/profiles"))
        );
        assert_eq!(ProfileCache::dir_from(None, None), None);
    }

    #[test]
    fn keys_are_stable_and_distinct() {
        assert_eq!(key_of(""), "cbf29ce484222325");
        assert_eq!(key_of("a"), "af63dc4c8601ec8c");
        assert_ne!(key_of("n1 A100"), key_of("n1 H100"));
    }

    #[test]
    fn store_then_lookup_until_stale() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ProfileCache {
            dir: dir.path().join("profiles"),
            ttl: Duration::from_secs(3600),
        };
        let profile = ClusterProfile {
            measured_perf: Vec::new(),
            note: None,
            nodes: vec![NodeProfile {
                host: "n1".into(),
                gpus: GpuInventory::Unknown,
                nvlink_domain: None,
            }],
            node_links: LinkMatrix::uniform(1, 1.0, Provenance::new(Source::Measured)),
        };
        assert_eq!(cache.lookup("k", SystemTime::now()), Lookup::Missing);
        let path = cache.store("k", &profile).unwrap();
        assert!(path.starts_with(&cache.dir));
        match cache.lookup("k", SystemTime::now()) {
            Lookup::Fresh { profile: p, .. } => assert_eq!(*p, profile),
            other => panic!("{other:?}"),
        }
        let later = SystemTime::now() + Duration::from_secs(7200);
        assert!(matches!(cache.lookup("k", later), Lookup::Stale { .. }));
        std::fs::write(cache.path("bad"), "{").unwrap();
        assert!(matches!(
            cache.lookup("bad", SystemTime::now()),
            Lookup::Unreadable { .. }
        ));
    }
}
