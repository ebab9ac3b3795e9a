//! Decoding a binary snapshot body from its verified chunks, section by section, holding one
//! index block (not one chunk) beyond what the state itself needs.

use std::collections::BTreeSet;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use weir_common::FileId;
use weir_format::{index_block_len, IndexDecoder, IndexRow, INDEX_BLOCK_HEADER};

use super::{Manifest, ReadFailure, Section, SnapshotBody, SNAPSHOT_FORMAT};

/// The fewest bytes an index row takes: one per column.
const MIN_INDEX_ROW_BYTES: u64 = 6;
use crate::log::FenceSlots;
use crate::state::{IndexEntry, State};

fn unreadable(reason: impl Into<String>) -> ReadFailure {
    ReadFailure::Unreadable(reason.into())
}

/// Checks what the manifest says before any chunk is read: a known format, and sections that
/// tile the body (the chunks' total) in order: `small`, `files`, then index sections.
pub(super) fn check_manifest(manifest: &Manifest) -> Result<(), ReadFailure> {
    if !(1..=SNAPSHOT_FORMAT).contains(&manifest.format) {
        return Err(unreadable(format!(
            "snapshot format {} (this build reads {SNAPSHOT_FORMAT})",
            manifest.format
        )));
    }
    let body: u64 = manifest.chunks.iter().map(|c| c.len).sum();
    let mut next = 0u64;
    for (i, section) in manifest.sections.iter().enumerate() {
        let in_place = match section {
            Section::Small { .. } => i == 0,
            Section::Files { .. } => i == 1,
            Section::Index { .. } => i >= 2,
        };
        let (offset, len) = section.range();
        if !in_place || offset != next {
            return Err(unreadable(format!("section {i} out of place")));
        }
        next = next
            .checked_add(len)
            .ok_or_else(|| unreadable("section lengths overflow"))?;
    }
    if manifest.sections.len() < 2 || next != body {
        return Err(unreadable(format!(
            "sections cover {next} bytes of a {body}-byte body"
        )));
    }
    Ok(())
}

/// Decodes the body that `chunks` (verified, in order) carry, as `manifest` lays it out.
pub(super) async fn decode_body<S>(
    manifest: &Manifest,
    chunks: S,
) -> Result<(State, FenceSlots), ReadFailure>
where
    S: Stream<Item = Result<Bytes, ReadFailure>> + Unpin,
{
    check_manifest(manifest)?;
    let mut reader = BodyReader {
        chunks,
        current: Bytes::new(),
    };
    let mut sections = manifest.sections.iter();
    let small = reader.read(len_of(sections.next())?).await?;
    let SnapshotBody { mut state, fence } = serde_json::from_slice(&small)
        .map_err(|err| unreadable(format!("small section: {err}")))?;
    drop(small);
    let files = read_files(&mut reader, sections.next()).await?;
    let mut filled = BTreeSet::new();
    for section in sections {
        let Section::Index {
            topic,
            partition,
            len,
            entries,
            ..
        } = section
        else {
            return Err(unreadable("a second small or files section"));
        };
        if !filled.insert((topic, *partition)) {
            return Err(unreadable(format!(
                "two index sections for {topic}-{partition}"
            )));
        }
        let target = state
            .topics
            .get_mut(topic)
            .and_then(|t| t.partitions.get_mut(*partition as usize))
            .ok_or_else(|| unreadable(format!("index of unknown partition {topic}-{partition}")))?;
        let index = read_index(&mut reader, *len, *entries, &files).await?;
        if index.len() as u64 != *entries {
            return Err(unreadable(format!(
                "{topic}-{partition}: {} index entries, the manifest says {entries}",
                index.len()
            )));
        }
        target.index = index.into_iter().collect();
    }
    reader.finish().await?;
    Ok((state, fence))
}

fn len_of(section: Option<&Section>) -> Result<usize, ReadFailure> {
    let (_, len) = section
        .ok_or_else(|| unreadable("missing section"))?
        .range();
    usize::try_from(len).map_err(|_| unreadable("section longer than memory"))
}

/// The file table: 16-byte big-endian ids.
async fn read_files<S>(
    reader: &mut BodyReader<S>,
    section: Option<&Section>,
) -> Result<Vec<FileId>, ReadFailure>
where
    S: Stream<Item = Result<Bytes, ReadFailure>> + Unpin,
{
    let Some(Section::Files { len, count, .. }) = section else {
        return Err(unreadable("no file table"));
    };
    if count.checked_mul(16) != Some(*len) || *count > u64::from(u32::MAX) {
        return Err(unreadable(format!(
            "file table of {count} ids in {len} bytes"
        )));
    }
    let bytes = reader.read(len_of(section)?).await?;
    Ok(bytes
        .chunks_exact(16)
        .map(|id| FileId(u128::from_be_bytes(id.try_into().expect("16-byte chunks"))))
        .collect())
}

/// One partition's index: blocks until the section's `len` bytes are used up.
async fn read_index<S>(
    reader: &mut BodyReader<S>,
    len: u64,
    entries: u64,
    files: &[FileId],
) -> Result<Vec<IndexEntry>, ReadFailure>
where
    S: Stream<Item = Result<Bytes, ReadFailure>> + Unpin,
{
    let mut decoder = IndexDecoder::new(files.len() as u32);
    let mut rows: Vec<IndexRow> = Vec::new();
    // Sized once from the manifest, but never beyond what `len` bytes could hold: a row takes
    // at least one byte per column.
    let mut index = Vec::with_capacity(entries.min(len / MIN_INDEX_ROW_BYTES) as usize);
    let mut remaining = len;
    while remaining > 0 {
        let header = reader.read(INDEX_BLOCK_HEADER).await?;
        let header = header[..]
            .try_into()
            .expect("read returns the length asked");
        let block_len = index_block_len(header).map_err(|err| unreadable(err.to_string()))?;
        let framed = (INDEX_BLOCK_HEADER + block_len) as u64;
        if framed > remaining {
            return Err(unreadable("an index block runs past its section"));
        }
        let body = reader.read(block_len).await?;
        rows.clear();
        decoder
            .decode_block(&body, &mut rows)
            .map_err(|err| unreadable(err.to_string()))?;
        index.extend(rows.iter().map(|row| IndexEntry {
            base_offset: row.base_offset,
            last_offset: row.last_offset,
            // The decoder checked every reference against the table's length.
            file_id: files[row.file as usize],
            byte_offset: row.byte_offset,
            len: row.len,
            first_timestamp: row.first_timestamp,
            max_timestamp: row.max_timestamp,
        }));
        remaining -= framed;
    }
    Ok(index)
}

/// The body as one byte stream over its chunks.
struct BodyReader<S> {
    chunks: S,
    current: Bytes,
}

impl<S> BodyReader<S>
where
    S: Stream<Item = Result<Bytes, ReadFailure>> + Unpin,
{
    /// The next `len` bytes: a slice of the current chunk, or a copy of the pieces when they
    /// straddle chunks. The copy grows only with bytes that arrived, whatever `len` claims.
    async fn read(&mut self, len: usize) -> Result<Bytes, ReadFailure> {
        if self.current.len() >= len {
            return Ok(self.current.split_to(len));
        }
        let mut joined = Vec::new();
        while joined.len() + self.current.len() < len {
            joined.extend_from_slice(&self.current);
            self.current = match self.chunks.next().await {
                Some(chunk) => chunk?,
                None => return Err(unreadable("the body ends inside a section")),
            };
        }
        let rest = len - joined.len();
        joined.extend_from_slice(&self.current.split_to(rest));
        Ok(joined.into())
    }

    /// Fails unless the body is used up.
    async fn finish(&mut self) -> Result<(), ReadFailure> {
        if !self.current.is_empty() {
            return Err(unreadable("bytes after the last section"));
        }
        match self.chunks.next().await {
            None => Ok(()),
            Some(Err(failure)) => Err(failure),
            Some(Ok(_)) => Err(unreadable("chunks after the last section")),
        }
    }
}
