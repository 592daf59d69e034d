//! The terminal mode of the password prompt (termios through rustix, no `unsafe`).

use std::io;
use std::os::fd::BorrowedFd;

use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions, SpecialCodeIndex, Termios};

/// A terminal's settings while a password is typed: no echo, bytes one at a time, Ctrl-C as
/// a byte (so the settings are put back before the process stops). Restored on drop.
pub struct Unechoed<'a> {
    fd: BorrowedFd<'a>,
    saved: Termios,
}

impl<'a> Unechoed<'a> {
    /// Switches the terminal `fd` to that mode (pending input is discarded, `TCSAFLUSH`).
    pub fn new(fd: BorrowedFd<'a>) -> io::Result<Unechoed<'a>> {
        let saved = tcgetattr(fd)?;
        let mut raw = saved.clone();
        raw.local_modes -= LocalModes::ECHO | LocalModes::ECHONL | LocalModes::ICANON | LocalModes::ISIG;
        raw.special_codes[SpecialCodeIndex::VMIN] = 1;
        raw.special_codes[SpecialCodeIndex::VTIME] = 0;
        tcsetattr(fd, OptionalActions::Flush, &raw)?;
        Ok(Unechoed { fd, saved })
    }
}

impl Drop for Unechoed<'_> {
    fn drop(&mut self) {
        let _ = tcsetattr(self.fd, OptionalActions::Now, &self.saved);
    }
}
