//! `pipette completions` and `pipette man`: generated text (a completion script, a manual
//! page) written to stdout as it is.

use crate::cli::Program;
use crate::error::Error;

/// `pipette completions SHELL`.
pub(super) fn completions(shell: clap_complete::Shell, program: Program) -> Result<(), Error> {
    write_stdout(&crate::cli::completions(shell, program))
}

/// `pipette man`.
pub(super) fn man(program: Program) -> Result<(), Error> {
    let page = crate::cli::man_page(program)
        .map_err(|e| Error::Internal(format!("rendering the manual page: {e}")))?;
    write_stdout(&page)
}

/// Writes generated text (a completion script, a manual page) to stdout as it is.
fn write_stdout(bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`pipette man | head`) is the reader's choice, not an error.
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Usage(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}
