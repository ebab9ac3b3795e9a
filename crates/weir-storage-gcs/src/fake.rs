//! An in-memory Rapid bucket behind the client's mocking interface
//! (`google_cloud_storage::stub::Storage`), so [`crate::GcsRapid`] runs through the real client
//! API in tests.
//!
//! It models what the service is known to do: objects keyed by name with a generation, the
//! persisted bytes, a finalized flag and one writer stream at a time; `ifGenerationMatch` on
//! create (0 = no live object); a reopen names the object's generation and becomes the one
//! writer. The previous writer's next flush then fails with `ABORTED`, a flush of a finalized
//! object with `FAILED_PRECONDITION`, anything on a deleted object with `NOT_FOUND`. Bytes land
//! only on flush, finalize or close (the real client may send them earlier; Weir's writer never
//! hands it bytes before a flush).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use google_cloud_gax::error::rpc::{Code, Status};
use google_cloud_storage::appendable_object_writer::AppendableObjectWriter;
use google_cloud_storage::http::HeaderMap;
use google_cloud_storage::model::Object;
use google_cloud_storage::model_ext::{
    ObjectHighlights, OpenAppendableObjectRequest, OpenObjectRequest, ReadRange,
    ReopenAppendableObjectRequest,
};
use google_cloud_storage::object_descriptor::ObjectDescriptor;
use google_cloud_storage::read_object::ReadObjectResponse;
use google_cloud_storage::request_options::RequestOptions;
use google_cloud_storage::{stub, Error, Result};

fn status(code: Code, message: &str) -> Error {
    Error::service(Status::default().set_code(code).set_message(message))
}

/// One object of the bucket.
#[derive(Debug)]
struct FakeObject {
    generation: i64,
    metageneration: i64,
    data: Vec<u8>,
    finalized: bool,
    /// The stream that may append (the latest create or reopen).
    writer: u64,
}

impl FakeObject {
    fn to_model(&self, bucket: &str, name: &str) -> Object {
        let object = Object::new()
            .set_bucket(bucket)
            .set_name(name)
            .set_generation(self.generation)
            .set_metageneration(self.metageneration)
            .set_size(self.data.len() as i64);
        match self.finalized {
            true => object.set_finalize_time(wkt::Timestamp::default()),
            false => object,
        }
    }
}

/// A failure the next writer flush (or finalize, or close) meets.
#[derive(Debug, Clone, Copy)]
struct Fault {
    code: Code,
    /// Whether the bytes land before the error (the answer is lost) or not at all.
    landed: bool,
}

#[derive(Debug, Default)]
struct State {
    objects: HashMap<String, FakeObject>,
    next_generation: i64,
    next_stream: u64,
    fault: Option<Fault>,
    opens: Vec<OpenAppendableObjectRequest>,
    reopens: Vec<ReopenAppendableObjectRequest>,
}

impl State {
    fn stream(&mut self) -> u64 {
        self.next_stream += 1;
        self.next_stream
    }
}

/// The in-memory bucket (see the module docs). Clones share the bucket.
#[derive(Debug, Clone)]
pub(crate) struct FakeRapid {
    /// `projects/_/buckets/{name}`.
    bucket: String,
    state: Arc<Mutex<State>>,
}

impl FakeRapid {
    /// An empty bucket named `name`.
    pub(crate) fn new(name: &str) -> FakeRapid {
        FakeRapid {
            bucket: format!("projects/_/buckets/{name}"),
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next writer flush fails with `code`, after its bytes land when `landed`.
    pub(crate) fn fail_next_flush(&self, code: Code, landed: bool) {
        self.state().fault = Some(Fault { code, landed });
    }

    /// Deletes `name`, as another client might.
    pub(crate) fn delete(&self, name: &str) {
        self.state().objects.remove(name);
    }

    /// Every open (create) request received, oldest first.
    pub(crate) fn opens(&self) -> Vec<OpenAppendableObjectRequest> {
        self.state().opens.clone()
    }

    /// Every reopen (takeover) request received, oldest first.
    pub(crate) fn reopens(&self) -> Vec<ReopenAppendableObjectRequest> {
        self.state().reopens.clone()
    }

    fn check_bucket(&self, bucket: &str) -> Result<()> {
        match bucket == self.bucket {
            true => Ok(()),
            false => Err(status(Code::NotFound, "no such bucket")),
        }
    }

    fn writer(&self, name: &str, object: &FakeObject) -> AppendableObjectWriter {
        AppendableObjectWriter::new(FakeWriter {
            bucket: self.clone(),
            name: name.to_string(),
            generation: object.generation,
            stream: object.writer,
            persisted: object.data.len() as i64,
            pending: Vec::new(),
        })
    }

    fn create(&self, request: OpenAppendableObjectRequest) -> Result<AppendableObjectWriter> {
        let spec = &request.spec;
        let resource = spec
            .resource
            .as_ref()
            .ok_or_else(|| status(Code::InvalidArgument, "no resource"))?;
        self.check_bucket(&resource.bucket)?;
        if spec.appendable != Some(true) {
            return Err(status(
                Code::InvalidArgument,
                "zonal buckets take appends only",
            ));
        }
        let name = resource.name.clone();
        let mut state = self.state();
        state.opens.push(request.clone());
        let live = state.objects.get(&name).map(|o| o.generation).unwrap_or(0);
        if spec.if_generation_match.is_some_and(|g| g != live) {
            return Err(status(Code::FailedPrecondition, "ifGenerationMatch"));
        }
        state.next_generation += 1;
        let object = FakeObject {
            generation: state.next_generation,
            metageneration: 1,
            data: Vec::new(),
            finalized: false,
            writer: state.stream(),
        };
        let writer = self.writer(&name, &object);
        state.objects.insert(name, object);
        Ok(writer)
    }

    fn reopen(&self, request: ReopenAppendableObjectRequest) -> Result<AppendableObjectWriter> {
        self.check_bucket(&request.bucket)?;
        let mut state = self.state();
        state.reopens.push(request.clone());
        let stream = state.stream();
        let object = state
            .objects
            .get_mut(&request.object)
            .filter(|o| o.generation == request.generation)
            .ok_or_else(|| status(Code::NotFound, "no such object generation"))?;
        if object.finalized {
            return Err(status(Code::FailedPrecondition, "the object is finalized"));
        }
        if request
            .if_metageneration_match
            .is_some_and(|m| m != object.metageneration)
        {
            return Err(status(Code::FailedPrecondition, "ifMetagenerationMatch"));
        }
        object.metageneration += 1;
        object.writer = stream;
        Ok(self.writer(&request.object, object))
    }

    fn open(&self, request: OpenObjectRequest) -> Result<FakeDescriptor> {
        self.check_bucket(&request.bucket)?;
        let state = self.state();
        let object = state
            .objects
            .get(&request.object)
            .filter(|o| request.generation == 0 || o.generation == request.generation)
            .ok_or_else(|| status(Code::NotFound, "no such object"))?;
        Ok(FakeDescriptor {
            object: object.to_model(&self.bucket, &request.object),
            data: Bytes::copy_from_slice(&object.data),
        })
    }
}

impl stub::Storage for FakeRapid {
    async fn open_appendable_object(
        &self,
        request: OpenAppendableObjectRequest,
        _options: RequestOptions,
    ) -> Result<AppendableObjectWriter> {
        self.create(request)
    }

    async fn reopen_appendable_object(
        &self,
        request: ReopenAppendableObjectRequest,
        _options: RequestOptions,
    ) -> Result<AppendableObjectWriter> {
        self.reopen(request)
    }

    async fn open_object(
        &self,
        request: OpenObjectRequest,
        _options: RequestOptions,
    ) -> Result<(ObjectDescriptor, Vec<ReadObjectResponse>)> {
        let ranges = request.ranges.clone();
        let descriptor = self.open(request)?;
        let readers = ranges.iter().map(|r| descriptor.read(r)).collect();
        Ok((ObjectDescriptor::new(descriptor), readers))
    }
}

/// A writer stream of one object.
#[derive(Debug)]
struct FakeWriter {
    bucket: FakeRapid,
    name: String,
    generation: i64,
    stream: u64,
    persisted: i64,
    pending: Vec<Bytes>,
}

impl FakeWriter {
    /// Lands the pending bytes (and seals the object when `finalize`), as the service does on
    /// a flush, after checking that this stream still owns the object.
    fn persist(&mut self, finalize: bool) -> Result<Object> {
        let pending = std::mem::take(&mut self.pending);
        let bucket = self.bucket.bucket.clone();
        let mut state = self.bucket.state();
        let fault = state.fault.take();
        let object = state
            .objects
            .get_mut(&self.name)
            .filter(|o| o.generation == self.generation)
            .ok_or_else(|| status(Code::NotFound, "the object is gone"))?;
        if object.finalized {
            return Err(status(Code::FailedPrecondition, "the object is finalized"));
        }
        if object.writer != self.stream {
            return Err(status(Code::Aborted, "another writer took the object over"));
        }
        if let Some(Fault {
            code,
            landed: false,
        }) = fault
        {
            return Err(status(code, "injected: nothing landed"));
        }
        for chunk in pending {
            object.data.extend_from_slice(&chunk);
        }
        object.finalized = finalize;
        self.persisted = object.data.len() as i64;
        if let Some(Fault { code, .. }) = fault {
            return Err(status(
                code,
                "injected: the bytes landed, the answer is lost",
            ));
        }
        Ok(object.to_model(&bucket, &self.name))
    }
}

impl stub::AppendableObjectWriter for FakeWriter {
    async fn append(&mut self, chunk: Bytes) -> Result<()> {
        self.pending.push(chunk);
        Ok(())
    }

    async fn flush(&mut self) -> Result<i64> {
        Ok(self.persist(false)?.size)
    }

    async fn finalize(mut self) -> Result<Object> {
        self.persist(true)
    }

    async fn close(mut self) -> Result<i64> {
        Ok(self.persist(false)?.size)
    }

    fn generation(&self) -> i64 {
        self.generation
    }

    fn persisted_size(&self) -> i64 {
        self.persisted
    }
}

/// An open object: the metadata and bytes when it was opened, as a `BidiReadObject` stream
/// sees them.
#[derive(Debug)]
struct FakeDescriptor {
    object: Object,
    data: Bytes,
}

impl FakeDescriptor {
    fn read(&self, range: &ReadRange) -> ReadObjectResponse {
        let range = bounds(range, self.data.len() as u64);
        let mut highlights = ObjectHighlights::default();
        highlights.generation = self.object.generation;
        highlights.metageneration = self.object.metageneration;
        highlights.size = self.object.size;
        let body = self.data.slice(range.start as usize..range.end as usize);
        ReadObjectResponse::from_source(highlights, body)
    }
}

impl stub::ObjectDescriptor for FakeDescriptor {
    fn object(&self) -> Object {
        self.object.clone()
    }

    async fn read_range(&self, range: ReadRange) -> ReadObjectResponse {
        self.read(&range)
    }

    fn headers(&self) -> HeaderMap {
        HeaderMap::new()
    }
}

/// The bytes `range` selects in an object of `size` bytes, clamped to the object as the
/// service clamps a read limit past the end.
///
/// `ReadRange` keeps its variant private and has no accessors, so this reads its `Debug` form
/// (`ReadRange(Segment { offset: 1, limit: 2 })`, `ReadRange(Offset(1))`, `ReadRange(Tail(1))`);
/// a client that prints it otherwise panics here, in tests only.
fn bounds(range: &ReadRange, size: u64) -> Range<u64> {
    let text = format!("{range:?}");
    let numbers: Vec<u64> = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("digits"))
        .collect();
    match (text.split(['(', ' ']).nth(1), numbers.as_slice()) {
        (Some("Segment"), &[offset, limit]) => {
            let end = match limit {
                0 => size,
                _ => offset.saturating_add(limit).min(size),
            };
            offset.min(size)..end
        }
        (Some("Offset"), &[offset]) => offset.min(size)..size,
        (Some("Tail"), &[count]) => size.saturating_sub(count)..size,
        _ => panic!("unknown ReadRange form: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fake_read_range_bounds() {
        assert_eq!(bounds(&ReadRange::segment(2, 3), 10), 2..5);
        assert_eq!(bounds(&ReadRange::segment(8, 5), 10), 8..10);
        assert_eq!(bounds(&ReadRange::segment(4, 0), 10), 4..10);
        assert_eq!(bounds(&ReadRange::offset(7), 10), 7..10);
        assert_eq!(bounds(&ReadRange::tail(3), 10), 7..10);
        assert_eq!(bounds(&ReadRange::all(), 10), 0..10);
        assert_eq!(bounds(&ReadRange::segment(12, 1), 10), 10..10);
    }
}
