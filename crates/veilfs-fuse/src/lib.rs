//! FUSE adapter (mount arrives with issue 3).
