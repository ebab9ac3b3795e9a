//! Compare-and-set on a local directory, for `file://` buckets (one host).
//!
//! The object is a file whose first 8 bytes are its version, a counter (big-endian), followed by
//! the content. A write takes an exclusive `flock` on `{name}.lock` beside it (the kernel drops
//! the lock when its holder dies, so a crashed writer never blocks the next), reads the current
//! counter, compares it with the expected one, writes counter + 1 and the content to a temporary
//! file, fsyncs it, renames it over the object and fsyncs the directory, then unlocks. A reader
//! needs no lock: the rename replaces the file whole. Every process that writes the object must
//! go through this type (the lock is advisory).

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

use super::{CasError, CasObject, Version};

const HEADER: usize = 8;

/// A compare-and-set object in a local directory (see the module docs).
#[derive(Debug, Clone)]
pub struct LocalCas {
    path: PathBuf,
    lock: PathBuf,
    dir: PathBuf,
}

impl LocalCas {
    /// The object `name` in `dir` (created if missing).
    pub fn new(dir: &Path, name: &str) -> Result<LocalCas, CasError> {
        if name.is_empty() || name.contains('/') {
            return Err(CasError::Store(format!("bad object name {name:?}")));
        }
        std::fs::create_dir_all(dir).map_err(io)?;
        Ok(LocalCas {
            path: dir.join(name),
            lock: dir.join(format!("{name}.lock")),
            dir: dir.to_path_buf(),
        })
    }

    fn read_now(&self) -> Result<Option<(u64, Bytes)>, CasError> {
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let mut all = Vec::new();
        file.read_to_end(&mut all).map_err(io)?;
        if all.len() < HEADER {
            return Err(CasError::Store(format!(
                "{} is {} bytes, shorter than its version header",
                self.path.display(),
                all.len()
            )));
        }
        let mut counter = [0u8; HEADER];
        counter.copy_from_slice(&all[..HEADER]);
        let data = Bytes::from(all).slice(HEADER..);
        Ok(Some((u64::from_be_bytes(counter), data)))
    }

    fn write_now(&self, data: &[u8], expected: Option<u64>) -> Result<u64, CasError> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock)
            .map_err(io)?;
        lock.lock().map_err(io)?;
        let current = self.read_now()?.map(|(counter, _)| counter);
        if current != expected {
            return Err(CasError::Conflict);
        }
        let next = current.unwrap_or(0) + 1;
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            self.path
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        {
            let mut file = File::create(&tmp).map_err(io)?;
            file.write_all(&next.to_be_bytes()).map_err(io)?;
            file.write_all(data).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
        // The lock goes with the file handle.
        drop(lock);
        Ok(next)
    }
}

fn io(err: std::io::Error) -> CasError {
    CasError::Store(err.to_string())
}

fn version_of(counter: u64) -> Version {
    Version {
        e_tag: None,
        version: Some(counter.to_string()),
    }
}

#[async_trait]
impl CasObject for LocalCas {
    async fn read(&self) -> Result<Option<(Bytes, Version)>, CasError> {
        let this = self.clone();
        let read = tokio::task::spawn_blocking(move || this.read_now())
            .await
            .map_err(|e| CasError::Store(e.to_string()))??;
        Ok(read.map(|(counter, data)| (data, version_of(counter))))
    }

    async fn write(&self, data: Bytes, expected: Option<&Version>) -> Result<Version, CasError> {
        let expected = match expected {
            None => None,
            Some(version) => Some(
                version
                    .version
                    .as_deref()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(CasError::Conflict)?,
            ),
        };
        let this = self.clone();
        let counter = tokio::task::spawn_blocking(move || this.write_now(&data, expected))
            .await
            .map_err(|e| CasError::Store(e.to_string()))??;
        Ok(version_of(counter))
    }
}
