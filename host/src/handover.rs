//! One host per data directory, many callers: the process that holds an
//! embedded (RocksDB) ledger — a `toolguard serve`, or the first of several
//! `toolguard call`s started together — listens on a Unix socket beside the
//! ledger (`<ledger dir>.sock`, mode 0600), and every other `toolguard call`
//! on that data directory hands its call over instead of failing on the
//! ledger's lock. The holder runs it as one of its own, so identical calls
//! made in parallel meet in one process and the hold rule sees them all.
//!
//! The exchange, one JSON line each: the caller sends its config digest and
//! the call; the holder says it took the call, then answers with the result
//! or error; the caller prints it and then acknowledges, and only then does
//! the holder record that the caller was told (`docs/guard.md`). A caller
//! that dies before that leaves the call "never answered", which is the safe
//! side. A connection closed before the holder said it took the call (the
//! holder was exiting) ran nothing: the caller tries again.

use crate::error::{CallError, ErrorKind};
use crate::reload::Live;
use crate::runtime::{CallOutput, CallRequest};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// The most bytes one line of the exchange may have (arguments included).
const MAX_LINE: usize = 16 << 20;
/// How long the holder waits for a caller to say it printed the answer.
const ACK_WAIT: Duration = Duration::from_secs(30);
/// How often [`Listener::finish`] looks whether the calls taken are done.
const FINISH_POLL: Duration = Duration::from_millis(2);
/// The longest socket path Linux accepts (`sun_path`, with its NUL).
const MAX_PATH: usize = 107;

/// The socket of the ledger in `ledger_dir`, if its path is short enough.
pub fn socket_path(ledger_dir: &Path) -> Option<PathBuf> {
    let mut name = ledger_dir.as_os_str().to_owned();
    name.push(".sock");
    let path = PathBuf::from(name);
    (path.as_os_str().len() <= MAX_PATH).then_some(path)
}

/// A digest of a parsed config: a caller and the holder must run under the
/// same plugins and policy.
pub fn config_digest(config: &crate::Config) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(format!("{config:?}").as_bytes()))
}

/// What a caller sends.
#[derive(Serialize, Deserialize)]
struct Hello {
    config: String,
    request: CallRequest,
}

/// What the holder answers.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Reply {
    /// The call is taken and runs: from here on, a connection that closes
    /// without an answer leaves the call's outcome unknown. Before it,
    /// nothing ran.
    Taken,
    Ok {
        value: serde_json::Value,
        replayed: bool,
    },
    Error(CallError),
    /// Not run: the caller's config differs from the holder's.
    Refused {
        message: String,
    },
}

/// The holder's side: accepts handed-over calls until dropped.
pub struct Listener {
    path: PathBuf,
    /// Calls taken and not yet done (their acknowledgement included).
    active: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    /// Listens on `path` for calls run on what `live` serves (with its
    /// config: a caller's must be the same), and for reloads of it. A stale
    /// socket file (its holder died) is replaced; one that answers is left
    /// to its holder (another `serve` sharing this data directory on a
    /// PostgreSQL ledger).
    ///
    /// # Errors
    /// Another process listens there, or the socket cannot be bound.
    pub fn start(path: PathBuf, live: Arc<Live>) -> std::io::Result<Self> {
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("another toolguard process listens on {}", path.display())));
        }
        let _ = std::fs::remove_file(&path);
        // On PostgreSQL nothing else may have made the data directory yet.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let active = Arc::new(AtomicUsize::new(0));
        let a = active.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Counted before the next await: an abort of this loop never
                // leaves an accepted call uncounted.
                a.fetch_add(1, Ordering::SeqCst);
                let (live, a) = (live.clone(), a.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve_one(stream, &live).await {
                        tracing::debug!(error = %e, "a handed-over call's caller went away");
                    }
                    a.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(Self { path, active, task })
    }

    /// Takes no more calls and waits for those taken to finish, their
    /// callers' acknowledgements recorded: then a `toolguard call` that holds
    /// the ledger may record its own answer and exit. A caller whose
    /// connection was still waiting to be accepted sees it closed before
    /// its call was taken, and tries again (it may become the next holder).
    pub async fn finish(self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
        while self.active.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(FINISH_POLL).await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs one handed-over call and records that its caller was told, once it
/// says it printed the answer.
async fn serve_one(stream: UnixStream, live: &Live) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read.take(MAX_LINE as u64 * 2));
    let hello = match read_line::<Incoming>(&mut lines).await? {
        None => return Ok(()),
        Some(Incoming::Reload { .. }) => return send(&mut write, &reloaded(live).await).await,
        Some(Incoming::Call(hello)) => hello,
    };
    // The generation serving as the call arrives runs it to its end.
    let (runtime, digest) = (live.runtime(), live.config().map(|c| config_digest(&c)).unwrap_or_default());
    if hello.config != digest {
        let message = "another toolguard process holds this data directory with a different config (plugins or policy); \
                       use the same config, or another data_dir"
            .to_string();
        return send(&mut write, &Reply::Refused { message }).await;
    }
    send(&mut write, &Reply::Taken).await?;
    let answer = runtime.call(&hello.request).await;
    let reply = match &answer {
        Ok(out) => Reply::Ok { value: out.value.clone(), replayed: out.replayed },
        Err(e) => Reply::Error(e.clone()),
    };
    send(&mut write, &reply).await?;
    if let Ok(Ok(Some(Delivered {}))) = tokio::time::timeout(ACK_WAIT, read_line::<Delivered>(&mut lines)).await {
        runtime.report(&hello.request, &answer).await;
    }
    Ok(())
}

/// What a caller sends: a call, or (`toolguard reload`) a reload.
#[derive(Deserialize)]
#[serde(untagged)]
enum Incoming {
    Reload {
        #[allow(dead_code)] // its presence is the message
        reload: bool,
    },
    Call(Hello),
}

/// What `toolguard reload` hears back: the report, or why it was refused.
async fn reloaded(live: &Live) -> serde_json::Value {
    match live.reload().await {
        Ok(report) => serde_json::json!({ "reloaded": true, "report": report }),
        Err(refused) => serde_json::json!({ "reloaded": false, "error": refused.to_string() }),
    }
}

/// Asks the `toolguard serve` listening on `path` to reload, and returns
/// what it answered (`{"reloaded": …}`).
///
/// # Errors
/// Nobody listens there, or it went away before answering.
pub async fn ask_reload(path: &Path) -> Result<serde_json::Value, String> {
    let mut stream =
        UnixStream::connect(path).await.map_err(|e| format!("no `toolguard serve` of this config listens on {} ({e}); is it running?", path.display()))?;
    send(&mut stream, &serde_json::json!({ "reload": true })).await.map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(&mut stream);
    read_line::<serde_json::Value>(&mut lines)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "the host closed the connection before it answered; look at its log".to_string())
}

/// The socket a `serve` of `config` listens on for handed-over calls and
/// reloads: beside its RocksDB ledger, or `<data_dir>/serve.sock` on
/// PostgreSQL; `None` if the path is too long for a Unix socket.
pub fn control_socket(config: &crate::Config) -> Option<PathBuf> {
    match config.ledger_dir() {
        Some(dir) => socket_path(dir),
        None => Some(config.data_dir.join("serve.sock")).filter(|p| p.as_os_str().len() <= MAX_PATH),
    }
}

/// The caller's acknowledgement: it printed the answer.
#[derive(Serialize, Deserialize)]
struct Delivered {}

async fn send<T: Serialize>(write: &mut (impl AsyncWriteExt + Unpin), message: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    write.write_all(&line).await?;
    write.flush().await
}

async fn read_line<T: serde::de::DeserializeOwned>(lines: &mut (impl AsyncBufReadExt + Unpin)) -> std::io::Result<Option<T>> {
    let mut line = String::new();
    if lines.read_line(&mut line).await? == 0 || line.len() > MAX_LINE {
        return Ok(None);
    }
    serde_json::from_str(&line).map(Some).map_err(std::io::Error::other)
}

/// A call handed over to the holder: its answer, and the means to say it
/// was printed.
pub struct HandedOver {
    /// The holder's answer.
    pub answer: Result<CallOutput, CallError>,
    stream: UnixStream,
}

impl HandedOver {
    /// Tells the holder the answer reached the caller.
    pub async fn delivered(mut self) {
        let _ = send(&mut self.stream, &Delivered {}).await;
        // Wait for the holder to close: it has recorded the report by then.
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(ACK_WAIT, self.stream.read_to_end(&mut rest)).await;
    }
}

/// Why a call could not be handed over.
#[derive(Debug)]
pub enum HandOff {
    /// Nobody listens (the holder is starting, or exiting): retry the ledger.
    NoHolder,
    /// The holder refused it (another config), with why.
    Refused(String),
}

/// Hands `request` to the process listening on `path`.
///
/// # Errors
/// See [`HandOff`]. If the holder dies after taking the call, the answer is
/// an `outcome-unknown` error: the call may have taken effect.
pub async fn hand_over(path: &Path, digest: &str, request: &CallRequest) -> Result<HandedOver, HandOff> {
    let mut stream = UnixStream::connect(path).await.map_err(|_| HandOff::NoHolder)?;
    let hello = Hello { config: digest.to_string(), request: request.clone() };
    send(&mut stream, &hello).await.map_err(|_| HandOff::NoHolder)?;
    let mut lines = BufReader::new(&mut stream);
    let mut reply = read_line::<Reply>(&mut lines).await.ok().flatten();
    match reply {
        // Closed before the call was taken: nothing ran.
        None => return Err(HandOff::NoHolder),
        Some(Reply::Taken) => reply = read_line::<Reply>(&mut lines).await.ok().flatten(),
        // A holder of an earlier version answers without saying it took the call.
        Some(_) => {}
    }
    let answer = match reply {
        Some(Reply::Ok { value, replayed }) => Ok(CallOutput { value, replayed }),
        Some(Reply::Error(e)) => Err(e),
        Some(Reply::Refused { message }) => return Err(HandOff::Refused(message)),
        None | Some(Reply::Taken) => Err(CallError::new(
            ErrorKind::OutcomeUnknown,
            "the toolguard process running this call stopped before it answered; it may have taken effect. \
             Retrying the same tool-call id is safe: it never does it twice",
        )),
    };
    Ok(HandedOver { answer, stream })
}

#[cfg(test)]
mod tests {
    use super::{HandOff, hand_over};
    use crate::error::ErrorKind;
    use crate::runtime::CallRequest;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    fn request() -> CallRequest {
        CallRequest { session: "s".into(), call_id: "c1".into(), tool: "refund".into(), args_json: "{}".into(), principal: None, tenant: None }
    }

    /// A holder that reads the caller's hello, writes `lines`, and closes.
    async fn holder_saying(lines: &'static [&'static str]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, mut write) = stream.into_split();
            let mut hello = String::new();
            BufReader::new(read).read_line(&mut hello).await.unwrap();
            for line in lines {
                write.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            }
        });
        (dir, path)
    }

    #[tokio::test]
    async fn a_connection_closed_before_the_call_was_taken_ran_nothing_and_is_tried_again() {
        let (_dir, path) = holder_saying(&[]).await;
        assert!(matches!(hand_over(&path, "digest", &request()).await, Err(HandOff::NoHolder)), "nothing ran: the caller tries the ledger again");
    }

    #[tokio::test]
    async fn a_connection_closed_after_the_call_was_taken_leaves_its_outcome_unknown() {
        let (_dir, path) = holder_saying(&[r#""taken""#]).await;
        let Ok(handed) = hand_over(&path, "digest", &request()).await else { panic!("taken: the call may have run") };
        let e = handed.answer.expect_err("no answer came");
        assert_eq!(e.kind, ErrorKind::OutcomeUnknown, "{e:?}");
    }

    #[tokio::test]
    async fn a_taken_call_is_answered() {
        let (_dir, path) = holder_saying(&[r#""taken""#, r#"{"ok":{"value":{"n":1},"replayed":false}}"#]).await;
        let Ok(handed) = hand_over(&path, "digest", &request()).await else { panic!("answered") };
        assert_eq!(handed.answer.expect("the holder's answer").value["n"], 1);
    }
}
