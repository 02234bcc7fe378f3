//! Index code shared by the built-in routers (none of it is a policy): which replicas hold which
//! prefix blocks, and which replica has the least load.
//! - [`block_index`]: holders per block hash, and a recency queue (Dynamo, llm-d, AIBrix,
//!   production-stack);
//! - [`block_runs`]: holders per run of blocks, for Dynamo and llm-d;
//! - [`lru_runs`]: llm-d's approximate per-replica LRU over runs;
//! - [`members`]: which per-replica state each routable index names as replicas come and go;
//! - [`min_index`]: the least-loaded routers' argmin with one fair draw for ties;
//! - [`qps`]: production-stack's lowest-request-rate fallback.

pub mod block_index;
pub mod block_runs;
pub mod lru_runs;
pub mod members;
pub mod min_index;
pub mod qps;
