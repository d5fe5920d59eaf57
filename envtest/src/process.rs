//! Child processes that must not outlive the test that started them.
//!
//! Three defences, because each one alone has a gap:
//! - every child leads its own process group, so a signal to the group also reaches what it forked;
//! - [`Process`]'s `Drop` stops the group (SIGTERM, then SIGKILL after a grace period);
//! - every child gets `PR_SET_PDEATHSIG = SIGKILL`, so it dies when the test binary dies, even when no
//!   destructor runs (a `static` is never dropped; `kill -9`, `panic = "abort"`). The kernel sends that
//!   signal when the *thread* that forked the child exits, not the process, so all children are forked by
//!   one thread that lives as long as the process ([`spawn`]): a child started from a test's thread or a
//!   runtime's worker would otherwise be killed when that thread ends, with the shared control plane still
//!   in use by other tests.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Starts `cmd` in a new process group, from the long-lived spawner thread, with a parent-death signal.
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    cmd.process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls (prctl,
    // getppid), allocating nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then nobody would send the signal.
            if libc::getppid() == 1 {
                return Err(io::Error::other(
                    "the parent exited while the child started",
                ));
            }
            Ok(())
        });
    }
    let (reply, answer) = mpsc::channel();
    spawner()
        .lock()
        .map_err(|_| io::Error::other("the spawner thread's lock is poisoned"))?
        .send((cmd, reply))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the spawner thread did not answer"))?
}

/// The sender to the one thread that forks every child; started on first use, never stopped.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // If the thread cannot start, every later send fails with "the spawner thread is gone".
        let _ = std::thread::Builder::new()
            .name("envtest-spawner".to_owned())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        Mutex::new(tx)
    })
}

/// Sends `signal` to the process group led by `pid`.
pub fn signal_group(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

/// A named child process (and its process group) whose output goes to a log file.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    /// Set once the child was reaped: its pid (and group id) may then belong to someone else.
    exited: Option<ExitStatus>,
}

impl Process {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn start(name: &str, mut cmd: Command, log: &Path) -> Result<Process> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = spawn(cmd).with_context(|| format!("cannot start {name}"))?;
        Ok(Process {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
            exited: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status, once the process has exited (reaping it).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// An error carrying the exit status and the end of the log if the process is no longer running.
    pub fn check_running(&mut self) -> Result<()> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => bail!(
                "{} exited ({status}); the end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 30)
            ),
        }
    }

    /// SIGTERM to the group, then SIGKILL if the process is still there after `grace`; waits for it.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.exit_status().is_none() {
            signal_group(self.pid(), libc::SIGTERM);
            let deadline = Instant::now() + grace;
            while self.exit_status().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.exit_status().is_none() {
                signal_group(self.pid(), libc::SIGKILL);
                self.exited = self.child.wait().ok();
            }
        }
        self.exited
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The last `lines` lines of a log file (at most its last 64 KiB), for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(cannot read {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_group_is_gone_and_its_log_kept() {
        let dir = std::env::temp_dir().join(format!("envtest-process-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sleep.log");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; sleep 30 & sleep 30"]);
        let mut p = Process::start("sleep", cmd, &log).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        p.check_running().unwrap();
        let status = p.stop(Duration::from_secs(2)).unwrap();
        assert!(!status.success());
        assert!(p.check_running().is_err());
        assert_eq!(tail(&log, 5), "started");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
