//! Orchestration (being written; the full version lands once the stages exist).
use std::ffi::OsString;
pub fn pipette_run_main(_args: impl IntoIterator<Item = OsString>) -> i32 {
    0
}
pub fn pipette_main(_args: impl IntoIterator<Item = OsString>) -> i32 {
    0
}
