//! Progress bars for long operations (mkfs, recover, journal bench), drawn on stderr with
//! indicatif, and only when stderr is a terminal: with stderr redirected to a file or a pipe
//! (scripts, tests, CI) nothing at all is drawn, and lines that go through
//! [`Progress::println`] are printed as plain `eprintln!` lines, exactly as without a bar.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar on stderr, or nothing.
pub struct Progress {
    bar: Option<ProgressBar>,
    /// The steady redraw has been started.
    ticking: AtomicBool,
}

impl Progress {
    /// A bar of `total` steps labelled `message`, drawn only when `wanted` and stderr is a
    /// terminal. `bytes` shows the counts as sizes (KiB, MiB) instead of plain numbers.
    pub fn new(message: &str, total: u64, wanted: bool, bytes: bool) -> Progress {
        if !wanted || !std::io::stderr().is_terminal() {
            return Progress { bar: None, ticking: AtomicBool::new(false) };
        }
        let counts = if bytes { "{bytes}/{total_bytes}" } else { "{pos}/{len}" };
        // wide_bar takes what the terminal's width leaves, so the line never wraps.
        let template = format!("{{msg}} [{{wide_bar}}] {counts} eta {{eta}}");
        let style = ProgressStyle::with_template(&template)
            .expect("the template is valid")
            .progress_chars("#>-");
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
            .with_style(style)
            .with_message(message.to_string());
        let progress = Progress { bar: Some(bar), ticking: AtomicBool::new(false) };
        if total > 0 {
            progress.start_ticking();
        }
        progress
    }

    /// Whether a bar is drawn (stderr is a terminal and the bar was wanted).
    pub fn is_drawn(&self) -> bool {
        self.bar.is_some()
    }

    /// Redraws even when the count does not move (a long step), so the ETA stays current; not
    /// before the total is known, so an empty bar is never drawn as a full one.
    fn start_ticking(&self) {
        if let Some(bar) = &self.bar {
            if !self.ticking.swap(true, Ordering::Relaxed) {
                bar.enable_steady_tick(Duration::from_millis(200));
            }
        }
    }

    /// `done` of `total` steps (the total may change as the work learns it).
    pub fn set(&self, done: u64, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_length(total);
            bar.set_position(done.min(total));
            if total > 0 {
                self.start_ticking();
            }
        }
    }

    /// One more step done.
    pub fn inc(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// A line on stderr above the bar (or a plain line when there is no bar).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Removes the bar, leaving the terminal as it was before it.
    pub fn finish(mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    // An error return (`?`) must not leave a half-drawn bar under the error message.
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
