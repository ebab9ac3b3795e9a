//! The messages of `weir.cluster.v1.Control`, as `prost` structs. Field numbers are the wire
//! format: never reuse one.

/// A forwarded write: `entry` is one log entry in the log's JSON.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SubmitRequest {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) entry: Vec<u8>,
}

/// The answer to submit `id`: the result's JSON and its slot once durable, or an error's JSON.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SubmitReply {
    #[prost(uint64, tag = "1")]
    pub(crate) id: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) result: Vec<u8>,
    #[prost(uint64, tag = "3")]
    pub(crate) seq: u64,
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) error: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct BarrierReply {
    #[prost(uint64, tag = "1")]
    pub(crate) durable: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusReply {
    #[prost(uint64, tag = "1")]
    pub(crate) epoch: u64,
    #[prost(bool, tag = "2")]
    pub(crate) available: bool,
    #[prost(uint64, tag = "3")]
    pub(crate) durable: u64,
}

/// A durable slot: its entries in the log's JSON.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Record {
    #[prost(uint64, tag = "1")]
    pub(crate) seq: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) epoch: u64,
    #[prost(bytes = "vec", tag = "3")]
    pub(crate) entries: Vec<u8>,
}

/// A follower's heartbeat to the leader (RFC 0002 §5).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HeartbeatRequest {
    #[prost(int32, tag = "1")]
    pub(crate) node_id: i32,
    #[prost(string, tag = "2")]
    pub(crate) incarnation: String,
}

/// A request to a job queue's broker on the called agent (RFC 0005 §5): the queue's name and
/// the request in its JSON.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct QueueCall {
    #[prost(string, tag = "1")]
    pub(crate) queue: String,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) request: Vec<u8>,
}

/// The broker's answer in its JSON.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct QueueAnswer {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) response: Vec<u8>,
}
