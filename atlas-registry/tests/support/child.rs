//! Test bodies in a process of their own: this same test binary, re-executed on one test that
//! runs the body the parent names.
//!
//! Atlas picks its driver once per process, and some cases end the process or leave it unusable
//! (a kernel fault loses the context for good, a crash kills it, an exit test exits): such a body
//! runs in a child. A test file lists its bodies once and runs each from a parent test:
//!
//! ```ignore
//! mod support;
//! use support::{child, standin};
//!
//! child::bodies!(launch_counts_one, trap_then_report);
//!
//! #[test]
//! fn launch_is_counted() {
//!     standin::run(launch_counts_one, &[]); // the stand-in libcuda as the child's driver
//! }
//!
//! #[test]
//! #[ignore = "needs an NVIDIA GPU"]
//! fn a_trap_is_reported() {
//!     let child = child::run_on(trap_then_report, None); // the real driver
//!     assert_eq!(child.ending, child::Ending::Passed, "{child}");
//! }
//! # fn launch_counts_one() {}
//! # fn trap_then_report() {}
//! ```
//!
//! [`bodies!`] must be invoked at the top level of the test file: it defines the `#[test]`
//! `child_body` that the child runs, which does nothing in an ordinary test run (so
//! `--include-ignored` on a GPU machine is harmless). The child is started as
//! `<test binary> child_body --exact --nocapture --test-threads=1 -q` with `ATLAS_TEST_CHILD_BODY`
//! naming the body (its path, as [`std::any::type_name`] spells it) and, when a library is given,
//! `ATLAS_LIBCUDA_PATH` naming it.
//!
//! Where the test binary runs through an emulator that the kernel does not apply by itself (an
//! AArch64 binary under `qemu-aarch64` on an x86-64 machine without binfmt_misc), the binary cannot
//! start itself again: `ATLAS_TEST_RUNNER` names the command that runs it (e.g. `qemu-aarch64`,
//! as cargo's `CARGO_TARGET_<TRIPLE>_RUNNER`), and children are started through it.

use std::any::type_name;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use atlas_registry::sys::LIBCUDA_PATH_VAR;

/// The command (words split at whitespace) that test binaries run through, when they need one.
pub const RUNNER_VAR: &str = "ATLAS_TEST_RUNNER";
/// Names the body a child runs; absent in an ordinary test run.
const BODY_VAR: &str = "ATLAS_TEST_CHILD_BODY";
/// The dispatcher test that [`bodies!`] defines.
const CHILD_TEST: &str = "child_body";
/// A child still running after this long is killed and reported as [`Ending::TimedOut`].
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Exit status 0: the body returned (or exited with 0).
    Passed,
    /// Another exit status (101: the body panicked).
    Failed(i32),
    /// Killed by this signal (11: SIGSEGV, 6: SIGABRT): the process crashed.
    Crashed(i32),
    /// Still running after [`CHILD_TIMEOUT`]; killed.
    TimedOut,
}

/// What a child process did.
#[derive(Debug)]
pub struct Child {
    /// How it ended.
    pub ending: Ending,
    /// Everything it wrote to stdout (the body's `println!`s among the test harness's lines).
    pub stdout: String,
    /// Everything it wrote to stderr (panic messages, Atlas's `atlas:` lines, the stand-in's
    /// complaints).
    pub stderr: String,
}

impl std::fmt::Display for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the child ended {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.ending, self.stdout, self.stderr
        )
    }
}

impl Child {
    /// The lines Atlas printed itself (`atlas: ...`, from a `Drop` with nobody to return an error
    /// to), on either stream.
    pub fn atlas_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .chain(self.stdout.lines())
            .filter(|l| l.starts_with("atlas:"))
            .collect()
    }

    /// Prints how the child `what` ended and the last 60 lines of each stream (shown when the
    /// parent test fails, or runs with `--nocapture`).
    pub fn print_tail(&self, what: &str) {
        println!(
            "child `{what}`: {:?}\nstdout (end):\n{}\nstderr (end):\n{}",
            self.ending,
            tail(&self.stdout, 60),
            tail(&self.stderr, 60)
        );
    }
}

/// Runs `body` in a child process and returns how it ended and what it wrote. `library` is the
/// child's driver (`ATLAS_LIBCUDA_PATH`: a stand-in, or a shim in front of the real driver);
/// `None` leaves the driver to Atlas's own search, the real one. `body` must be listed in
/// [`bodies!`].
pub fn run_on<F: Fn()>(body: F, library: Option<&Path>) -> Child {
    run_with_env(body, library, &[])
}

/// As [`run_on`], with `env` added to the child's environment.
pub fn run_with_env<F: Fn()>(
    body: F,
    library: Option<&Path>,
    env: &[(&str, &std::ffi::OsStr)],
) -> Child {
    let mut command = command(body);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(library) = library {
        command.env(LIBCUDA_PATH_VAR, library);
    }
    command.envs(env.iter().copied());
    let mut process = command
        .spawn()
        .expect("the test binary can start itself again");
    // Read both pipes while waiting, so that a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(process.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(process.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let ending = loop {
        match process.try_wait().expect("waiting for the child") {
            Some(status) => match (status.code(), status.signal()) {
                (Some(0), _) => break Ending::Passed,
                (Some(code), _) => break Ending::Failed(code),
                (None, Some(signal)) => break Ending::Crashed(signal),
                (None, None) => unreachable!("a Unix process ends with a code or a signal"),
            },
            None if Instant::now() > deadline => {
                let _ = process.kill();
                let _ = process.wait();
                break Ending::TimedOut;
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    Child {
        ending,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// The command that starts this test binary as a child running `body` (listed in [`bodies!`]),
/// with the real driver unless the caller sets `ATLAS_LIBCUDA_PATH`; its standard streams are
/// the caller's to set.
pub fn command<F: Fn()>(body: F) -> Command {
    let _ = body; // Only its name is needed: the child runs it.
    let mut command = this_binary();
    command
        .args([
            CHILD_TEST,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(BODY_VAR, type_name::<F>());
    command
}

/// A command that starts this test binary again (through `ATLAS_TEST_RUNNER` when it is set);
/// its arguments, environment and standard streams are the caller's to add.
pub fn this_binary() -> Command {
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let runner = std::env::var(RUNNER_VAR).unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command.args(words).arg(exe);
            command
        }
        None => Command::new(exe),
    }
}

/// Lets the children started from now on inherit `fd` (clears its `FD_CLOEXEC`), and returns
/// its number, to pass in an environment variable that the child reads with [`inherited_fd`].
pub fn inheritable(fd: BorrowedFd<'_>) -> String {
    // SAFETY: `fd` is open (borrowed for the call); F_SETFD only changes its close-on-exec flag.
    let set = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) };
    assert_eq!(set, 0, "fcntl(F_SETFD) on descriptor {}", fd.as_raw_fd());
    fd.as_raw_fd().to_string()
}

/// In a child, the descriptor whose number the parent put in the environment variable `var`
/// ([`inheritable`]), owned from now on.
pub fn inherited_fd(var: &str) -> OwnedFd {
    let number: i32 = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{var} names no descriptor"));
    // SAFETY: `fcntl(F_GETFD)` only asks whether the descriptor is open.
    let open = unsafe { libc::fcntl(number, libc::F_GETFD) };
    assert!(open >= 0, "descriptor {number} ({var}) was not inherited");
    // SAFETY: an open descriptor the parent passed to this process for the caller alone: nothing
    // else here owns or closes it.
    unsafe { OwnedFd::from_raw_fd(number) }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The name a body goes by between parent and child: its path, as the compiler spells it.
pub fn name_of<F: Fn()>(_body: &F) -> &'static str {
    type_name::<F>()
}

/// In a child, runs the body the parent named; in an ordinary test run, nothing.
pub fn dispatch(bodies: &[(&str, fn())]) {
    let Ok(name) = std::env::var(BODY_VAR) else {
        return;
    };
    match bodies.iter().find(|(listed, _)| *listed == name) {
        Some((_, body)) => body(),
        None => panic!("`{name}` is not a child body of this test file: add it to bodies!"),
    }
}

/// `bodies!(f, g, ...)`: the functions this test file runs in child processes. Defines the
/// `#[test] fn child_body`; invoke it once, at the top level of the test file.
macro_rules! bodies {
    ($($body:path),* $(,)?) => {
        /// Runs the child body a parent test asked for; in an ordinary test run, nothing.
        #[test]
        fn child_body() {
            $crate::support::child::dispatch(
                &[$(($crate::support::child::name_of(&$body), $body as fn())),*],
            );
        }
    };
}
pub(crate) use bodies;
