//! quill's journal engine (being written).
pub mod location;
pub use location::{JournalLocation, LocationExtent, LocationError};
