//! The local terminal for `sandbox exec -it`: raw mode while the remote terminal owns the
//! keyboard (restored when the guard drops, so on every return, error and unwinding panic),
//! and its size, to open the remote one alike and follow SIGWINCH.

use std::io::{IsTerminal, Stdin};
use std::os::fd::AsFd;

use rustix::termios::{self, OptionalActions, Termios};

/// Raw mode on stdin while this lives; the saved settings are put back on drop.
pub struct RawMode {
    stdin: Stdin,
    saved: Termios,
}

impl RawMode {
    /// Puts the terminal on stdin in raw mode (no echo, no line editing, ^C as a byte).
    pub fn enable() -> std::io::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw)?;
        Ok(RawMode { stdin, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing more can be done if the terminal is gone (a hang-up): ignore.
        let _ = termios::tcsetattr(self.stdin.as_fd(), OptionalActions::Now, &self.saved);
    }
}

/// The size (columns, rows) of the terminal on stdout, else on stdin; `None` when neither is
/// a terminal or it reports no size (0 × 0), so the API's default (80 × 24) applies.
pub fn size() -> Option<(u16, u16)> {
    let side = |n: u16| n.min(differently_client::pty::MAX_SIDE);
    let from = |ws: termios::Winsize| {
        (ws.ws_col > 0 && ws.ws_row > 0).then(|| (side(ws.ws_col), side(ws.ws_row)))
    };
    let out = std::io::stdout();
    if out.is_terminal() {
        if let Some(s) = termios::tcgetwinsize(out.as_fd()).ok().and_then(from) {
            return Some(s);
        }
    }
    let input = std::io::stdin();
    if input.is_terminal() {
        return termios::tcgetwinsize(input.as_fd()).ok().and_then(from);
    }
    None
}
