//! Many small tasks that can each crash the process (a blob handed to the driver), run in a pool
//! of child processes that outlives the crashes.
//!
//! The parent keeps `jobs` children busy (this test binary, re-executed on a body listed in
//! [`bodies!`](super::child::bodies)); each worker hands its child one task at a time on
//! standard input, as a line `<index> <task>`. The child ([`serve`]) answers `START <index>` before
//! it begins the task and `DONE <index> <answer>` after. When a child dies between the two, that
//! task crashed it: it is recorded as [`Outcome::Crashed`] and a new child takes the next task.
//! A child silent past the hang limit on a task it started is killed ([`Outcome::Hung`]). A child
//! that dies before it starts a task (it could not set itself up), or is silent for a minute (or
//! the hang limit, if longer) before it does, leaves the task to the next child; three in a row
//! fail the test, with the last one's standard error.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::child;

/// What became of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The child's answer.
    Answered(String),
    /// The child died on it: how (`killed by signal 11 (SIGSEGV)`, `exited with 101`).
    Crashed(String),
    /// The child was silent on it past the hang limit, and was killed.
    Hung,
}

/// Every task's outcome, in the order of the tasks, and how many children it took.
#[derive(Debug)]
pub struct Run {
    pub outcomes: Vec<Outcome>,
    pub children: usize,
    pub elapsed: Duration,
}

/// Runs `tasks` (one line each) in `jobs` children running `body`, each started with `env` set;
/// prints a progress line every 20 s while it runs.
pub fn run<F: Fn() + Copy + Sync>(
    body: F,
    env: &[(&str, String)],
    tasks: &[String],
    jobs: usize,
    hang: Duration,
) -> Run {
    let start = Instant::now();
    let queue = Mutex::new((0..tasks.len()).collect::<VecDeque<usize>>());
    let outcomes = Mutex::new(vec![None; tasks.len()]);
    let done = AtomicUsize::new(0);
    let children = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..jobs.clamp(1, tasks.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let worker = Worker {
                        spawn: &|| {
                            children.fetch_add(1, Ordering::Relaxed);
                            let mut command = child::command(body);
                            for (name, value) in env {
                                command.env(name, value);
                            }
                            command
                                .stdin(Stdio::piped())
                                .stdout(Stdio::piped())
                                .stderr(Stdio::piped())
                                .spawn()
                                .expect("starting a child process")
                        },
                        tasks,
                        queue: &queue,
                        outcomes: &outcomes,
                        done: &done,
                        hang,
                    };
                    worker.work();
                })
            })
            .collect();
        let mut last = Instant::now();
        while workers.iter().any(|w| !w.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() >= Duration::from_secs(20) {
                last = Instant::now();
                println!(
                    "  ... {} of {} done after {:.0} s",
                    done.load(Ordering::Relaxed),
                    tasks.len(),
                    start.elapsed().as_secs_f64()
                );
            }
        }
        for worker in workers {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let outcomes = outcomes
        .into_inner()
        .expect("no worker panicked holding the outcomes")
        .into_iter()
        .map(|o| o.expect("every task is run"))
        .collect();
    Run {
        outcomes,
        children: children.into_inner(),
        elapsed: start.elapsed(),
    }
}

/// In a child started by [`run`]: answers each task from standard input with `answer`, which
/// returns its answer (one line) and whether this process can take another task (false: it
/// exits, and the parent starts a new child for the next).
pub fn serve(mut answer: impl FnMut(&str) -> (String, bool)) {
    let stdin = std::io::stdin();
    for line in stdin.lock().lines().map_while(Result::ok) {
        let Some((index, task)) = line.split_once(' ') else {
            continue;
        };
        say(&format!("START {index}"));
        let (reply, go_on) = answer(task);
        say(&format!("DONE {index} {}", reply.replace('\n', " ")));
        if !go_on {
            say("BYE");
            std::process::exit(0);
        }
    }
}

/// One line to standard output, past the test harness's capture, at once.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Worker<'a> {
    spawn: &'a (dyn Fn() -> Child + Sync),
    tasks: &'a [String],
    queue: &'a Mutex<VecDeque<usize>>,
    outcomes: &'a Mutex<Vec<Option<Outcome>>>,
    done: &'a AtomicUsize,
    hang: Duration,
}

/// A running child, its stdin, and its stdout's lines.
struct Running {
    process: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Worker<'_> {
    fn next(&self) -> Option<usize> {
        self.queue.lock().expect("the queue").pop_front()
    }

    fn record(&self, index: usize, outcome: Outcome) {
        self.outcomes.lock().expect("the outcomes")[index] = Some(outcome);
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    fn start(&self) -> Running {
        let mut process = (self.spawn)();
        let stdin = process.stdin.take();
        let stdout = process.stdout.take().expect("a piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        // The end of what the child wrote to stderr, for when it cannot start.
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut pipe) = process.stderr.take() {
            let stderr = Arc::clone(&stderr);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    let mut text = stderr.lock().expect("the stderr tail");
                    text.push_str(&String::from_utf8_lossy(&chunk[..n]));
                    let cut = text.len().saturating_sub(4096);
                    let cut = (cut..text.len())
                        .find(|&i| text.is_char_boundary(i))
                        .unwrap_or(0);
                    text.drain(..cut);
                }
            });
        }
        Running {
            process,
            stdin,
            lines,
            stderr,
        }
    }

    fn work(&self) {
        let mut failed_starts = 0;
        let mut held = None;
        // A child is started when there is a task for it.
        let mut running: Option<Running> = None;
        while let Some(index) = held.take().or_else(|| self.next()) {
            let child = running.get_or_insert_with(|| self.start());
            let sent = child.stdin.as_mut().is_some_and(|stdin| {
                writeln!(stdin, "{index} {}", self.tasks[index])
                    .and_then(|()| stdin.flush())
                    .is_ok()
            });
            match sent.then(|| self.wait_for(child, index)) {
                Some(Ok(outcome)) => {
                    failed_starts = 0;
                    // A child that crashed or hung has been waited for.
                    if !matches!(outcome, Outcome::Answered(_)) {
                        running = None;
                    }
                    self.record(index, outcome);
                }
                // It ended before it started the task: the next child takes the task.
                gone => {
                    let _ = child.process.kill();
                    let status = child.process.wait().ok();
                    // A child that said it would not go on has not failed to start.
                    if gone != Some(Err(true)) {
                        failed_starts += 1;
                    }
                    assert!(
                        failed_starts < 3,
                        "children die before they take a task (the last {}); its stderr \
                         ends:\n{}",
                        status.map_or_else(|| "did not say".into(), describe),
                        child.stderr.lock().expect("the stderr tail")
                    );
                    running = None;
                    held = Some(index);
                }
            }
        }
        if let Some(mut child) = running {
            drop(child.stdin.take());
            let _ = child.process.wait();
        }
    }

    /// Waits for the child's answer to task `index`; `Err` if it ended before it started the
    /// task (`Err(true)`: it had said it would end).
    fn wait_for(&self, child: &mut Running, index: usize) -> Result<Outcome, bool> {
        let (mut started, mut bye) = (false, false);
        loop {
            // Before it starts the task a child may still be setting itself up (a driver's
            // initialisation): that gets at least a minute.
            let limit = if started {
                self.hang
            } else {
                self.hang.max(Duration::from_secs(60))
            };
            match child.lines.recv_timeout(limit) {
                Ok(line) => {
                    let mut words = line.splitn(3, ' ');
                    let (tag, at) = (
                        words.next(),
                        words.next().and_then(|i| i.parse::<usize>().ok()),
                    );
                    match (tag, at) {
                        (Some("START"), Some(i)) if i == index => started = true,
                        (Some("DONE"), Some(i)) if i == index => {
                            return Ok(Outcome::Answered(words.next().unwrap_or("").into()));
                        }
                        (Some("BYE"), _) => bye = true,
                        _ => {}
                    }
                }
                Err(RecvTimeoutError::Timeout) if started => {
                    let _ = child.process.kill();
                    let _ = child.process.wait();
                    return Ok(Outcome::Hung);
                }
                Err(RecvTimeoutError::Disconnected) if started => {
                    let status = child.process.wait().expect("waiting for a child");
                    return Ok(Outcome::Crashed(describe(status)));
                }
                Err(_) => return Err(bye),
            }
        }
    }
}

/// How a child ended: `killed by signal 11 (SIGSEGV)`, `exited with 101`.
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(signal)) => {
            let name = [
                (4, "SIGILL"),
                (6, "SIGABRT"),
                (7, "SIGBUS"),
                (8, "SIGFPE"),
                (9, "SIGKILL"),
                (11, "SIGSEGV"),
            ]
            .iter()
            .find(|(n, _)| *n == signal)
            .map_or(String::new(), |(_, name)| format!(" ({name})"));
            format!("killed by signal {signal}{name}")
        }
        (None, None) => format!("{status}"),
    }
}
