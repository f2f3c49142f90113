//! The read side: what a host, the command line and the test kit read back
//! from a store without writing it. `inspect` (sessions, turns, steps,
//! compactions, pins, a session's full transcript exported), `replay`
//! (rebuilding an executed step's messages byte for byte: G3) and `verify`
//! (the whole-database checks of G1-G8). Administration sits above it.

pub mod inspect;
pub mod replay;
pub mod verify;
