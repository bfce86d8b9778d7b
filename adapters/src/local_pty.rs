//! A real pseudo-terminal on the local machine, for `devhost`'s `exec.pty`.
//!
//! The master side stays here (non-blocking, read and written through tokio's `AsyncFd`); the
//! slave side becomes the program's stdin, stdout and stderr. The program is started through
//! `setsid -c` (util-linux) so that it leads a session of its own with the terminal as its
//! controlling terminal (`setsid` + `TIOCSCTTY`) without `unsafe` code in this process (the
//! workspace forbids it, and `pre_exec` is unsafe). Resizes are `TIOCSWINSZ` on the master
//! (the kernel sends `SIGWINCH` to the foreground group); signals go to the terminal's
//! foreground process group (`TIOCGPGRP`), as a keyboard's ^C would.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use bytes::Bytes;
use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::process::{Pid, Signal};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use crate::{PtySignal, PtySize};

/// Read size from the master.
const CHUNK: usize = 64 * 1024;

/// The master side of a terminal as the program's input: keystrokes, resizes, signals.
pub struct Master {
    fd: pipe::Sender,
}

/// The master side of a terminal as the program's output.
pub struct Output {
    fd: pipe::Receiver,
}

/// A freshly opened terminal: its master (two descriptors of it, one per direction), and the
/// slave to hand to the program.
pub struct Opened {
    pub master: Master,
    pub output: Output,
    pub slave: OwnedFd,
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

fn winsize(size: PtySize) -> Winsize {
    Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a terminal pair of `size`. Needs a tokio runtime (the master registers with it).
pub fn open(size: PtySize) -> io::Result<Opened> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags).map_err(errno)?;
    rustix::pty::grantpt(&master).map_err(errno)?;
    rustix::pty::unlockpt(&master).map_err(errno)?;
    let name = rustix::pty::ptsname(&master, Vec::new()).map_err(errno)?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(errno)?;
    rustix::termios::tcsetwinsize(&master, winsize(size)).map_err(errno)?;
    let fl = rustix::fs::fcntl_getfl(&master).map_err(errno)?;
    rustix::fs::fcntl_setfl(&master, fl | OFlags::NONBLOCK).map_err(errno)?;
    // tokio's pipe types poll any descriptor epoll accepts, a terminal master included,
    // without the `unsafe` registration `AsyncFd` now asks for.
    let reader = master.try_clone()?;
    Ok(Opened {
        master: Master {
            fd: pipe::Sender::from_owned_fd_unchecked(master)?,
        },
        output: Output {
            fd: pipe::Receiver::from_owned_fd_unchecked(reader)?,
        },
        slave,
    })
}

fn pid(raw: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(raw).ok()?)
}

fn signal_of(sig: PtySignal) -> Signal {
    match sig {
        PtySignal::Int => Signal::INT,
        PtySignal::Term => Signal::TERM,
        PtySignal::Kill => Signal::KILL,
        PtySignal::Hup => Signal::HUP,
    }
}

/// Sends `sig` to process group `pgid`; false if there is none.
pub fn signal_group(pgid: u32, sig: PtySignal) -> bool {
    pid(pgid).is_some_and(|p| rustix::process::kill_process_group(p, signal_of(sig)).is_ok())
}

impl Master {
    /// Sets the terminal's size; the kernel tells the foreground group (`SIGWINCH`).
    pub fn resize(&self, size: PtySize) -> io::Result<()> {
        rustix::termios::tcsetwinsize(self.fd.as_fd(), winsize(size)).map_err(errno)
    }

    /// Sends `sig` to the terminal's foreground process group, or to `session` (the group the
    /// program leads) when the terminal names none.
    pub fn signal(&self, sig: PtySignal, session: u32) -> bool {
        let fg = rustix::termios::tcgetpgrp(self.fd.as_fd()).ok();
        let target = fg.map_or(session, |p| p.as_raw_nonzero().get().unsigned_abs());
        signal_group(target, sig) || signal_group(session, sig)
    }

    /// Writes all of `bytes` (waiting while the terminal's input queue is full).
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.fd.write_all(bytes).await
    }
}

impl Output {
    /// Copies the terminal's output to `out` until the terminal closes (`EIO` once every slave
    /// descriptor is closed) or `out` does; true when `out` closed (the client hung up).
    pub async fn pump(mut self, out: mpsc::Sender<Bytes>) -> bool {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match self.fd.read(&mut buf).await {
                Ok(0) => return false,
                Ok(n) => n,
                Err(e) => {
                    if e.raw_os_error() != Some(Errno::IO.raw_os_error()) {
                        tracing::debug!(error = %e, "pty read ended");
                    }
                    return false;
                }
            };
            if out.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                return true;
            }
        }
    }
}
