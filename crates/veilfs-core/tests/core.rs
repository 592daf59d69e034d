//! The core's integration tests, one module per concern, linked into one test binary: each
//! binary costs a release link of the whole crate, so one binary instead of eight keeps the
//! inner loop (`scripts/test.sh --quick`) short. fault_atomic.rs stays a binary of its own:
//! it sets a per-process file-size limit.

mod common;

mod block_map;
mod config_copies;
mod deletions;
mod file_model;
mod fsck;
mod inner_stash;
mod iv_copy;
mod known;
mod lost_write;
mod overflow;
mod tamper;
mod upgrade;
