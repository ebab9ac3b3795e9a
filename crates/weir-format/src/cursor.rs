//! A bounds-checked big-endian reader shared by the decoders.

use crate::error::FormatError;

/// Reads big-endian integers from a slice; every read past the end is a
/// [`FormatError::Truncated`] naming `section`.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    section: &'static str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], section: &'static str) -> Self {
        Self { buf, section }
    }

    /// Fails unless at least `count * item_len` bytes remain, so a count read from untrusted
    /// input can size an allocation only if the input could actually hold that many items.
    pub(crate) fn ensure_items(&self, count: u32, item_len: usize) -> Result<(), FormatError> {
        let needed = u64::from(count) * item_len as u64;
        if needed > self.buf.len() as u64 {
            return Err(self.truncated(needed));
        }
        Ok(())
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], FormatError> {
        if len > self.buf.len() {
            return Err(self.truncated(len as u64));
        }
        let (head, tail) = self.buf.split_at(len);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        self.array().map(u16::from_be_bytes)
    }

    pub(crate) fn i16(&mut self) -> Result<i16, FormatError> {
        self.array().map(i16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn i32(&mut self) -> Result<i32, FormatError> {
        self.array().map(i32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        self.array().map(u64::from_be_bytes)
    }

    pub(crate) fn i64(&mut self) -> Result<i64, FormatError> {
        self.array().map(i64::from_be_bytes)
    }

    /// Fails if any bytes are left; call once a section is fully read.
    pub(crate) fn finish(self) -> Result<(), FormatError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        Err(FormatError::TrailingBytes {
            section: self.section,
            count: self.buf.len() as u64,
        })
    }

    fn truncated(&self, needed: u64) -> FormatError {
        FormatError::Truncated {
            section: self.section,
            needed,
            available: self.buf.len() as u64,
        }
    }
}
