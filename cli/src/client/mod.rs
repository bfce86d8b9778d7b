//! Client commands over the public `/v1` API (`differently sandbox …`, `differently admin …`):
//! the same calls an application makes, for operators and scripts. Answers are printed as
//! the API's JSON on stdout; errors name their stable code on stderr, never the key.

pub mod admin;
pub mod sandbox;

use std::process::ExitCode;

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Where the API is and which key to use.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// Base URL of the API.
    #[arg(
        long,
        env = "DIFFERENTLY_URL",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub url: String,
    /// API key (`dly_…`); prefer the variable, which stays out of shell history and `ps`.
    #[arg(
        long,
        env = "DIFFERENTLY_API_KEY",
        hide_env_values = true,
        global = true
    )]
    pub key: Option<String>,
    /// What to print: the API's JSON, or only the id (each item's id, a line each, for a list),
    /// for scripts: `ID=$(differently sandbox create -o id)`.
    #[arg(short = 'o', long, value_enum, default_value = "json", global = true)]
    pub output: Output,
}

/// How an answer is printed.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    Id,
}

impl Output {
    /// Prints `v` this way; an answer without an id is an error when ids were asked for.
    pub fn print(self, v: &Value) -> Result<(), ClientError> {
        match self {
            Output::Json => {
                print_json(v);
                Ok(())
            }
            Output::Id => {
                let ids: Vec<&str> = match v.get("items").and_then(Value::as_array) {
                    Some(items) => items.iter().filter_map(|i| i["id"].as_str()).collect(),
                    None => v["id"].as_str().into_iter().collect(),
                };
                if ids.is_empty() && v.get("items").is_none() {
                    return Err(ClientError::Outcome(
                        "the answer has no id (use -o json)".into(),
                    ));
                }
                ids.iter().for_each(|id| print_line(id));
                Ok(())
            }
        }
    }
}

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error.
    #[error("{status} {code}: {message}{details}")]
    Api {
        status: u16,
        code: String,
        message: String,
        /// ` (details: …)` or empty.
        details: String,
    },
    /// The API could not be reached or answered something that is not the API.
    #[error("{0}")]
    Transport(String),
    /// The command line asks for something that cannot be sent.
    #[error("{0}")]
    Usage(String),
    /// The API answered, but the outcome is not the one asked for (a `--wait` that ended
    /// with the sandbox failed, say).
    #[error("{0}")]
    Outcome(String),
}

/// A configured API client.
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    /// A client for `target`; the key is required.
    pub fn new(target: &Target) -> Result<Client, ClientError> {
        let key = target
            .key
            .clone()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| {
                ClientError::Usage("no API key: set DIFFERENTLY_API_KEY (or pass --key)".into())
            })?;
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| ClientError::Transport(format!("http client: {e}")))?;
        Ok(Client {
            http,
            base: target.url.trim_end_matches('/').to_owned(),
            key,
        })
    }

    /// Sends `method path` with an optional JSON body and extra headers; the answer's JSON
    /// (`null` for an empty body), or the API's error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method.clone(), &url)
            .bearer_auth(&self.key);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| transport_error(&method, &url, &self.base, e))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| ClientError::Transport(format!("{method} {url}: {}", e.without_url())))?;
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).map_err(|_| {
                ClientError::Transport(format!(
                    "{method} {url}: {status} with a body that is not JSON (is this a Differently API?)"
                ))
            })?
        };
        if status.is_success() {
            return Ok(value);
        }
        Err(api_error(status, &value))
    }
}

/// A request that got no answer, with its causes (reqwest's own message is only "error
/// sending request") and, when nothing listens there, what to check.
fn transport_error(method: &Method, url: &str, base: &str, e: reqwest::Error) -> ClientError {
    let connect = e.is_connect();
    let timeout = e.is_timeout();
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
        source = cause.source();
    }
    let hint = if connect {
        format!(
            " — cannot reach the API at {base}: is it running there? (--url or DIFFERENTLY_URL)"
        )
    } else if timeout {
        " — the API did not answer in time".to_owned()
    } else {
        String::new()
    };
    ClientError::Transport(format!("{method} {url}: {text}{hint}"))
}

fn api_error(status: StatusCode, body: &Value) -> ClientError {
    let e = &body["error"];
    let details = match e.get("details") {
        Some(d) if !d.is_null() => format!(" (details: {d})"),
        _ => String::new(),
    };
    ClientError::Api {
        status: status.as_u16(),
        code: e["code"].as_str().unwrap_or("unknown").to_owned(),
        message: e["message"]
            .as_str()
            .unwrap_or("the API answered an error without a message")
            .to_owned(),
        details,
    }
}

/// Prints `v` as indented JSON on stdout.
pub fn print_json(v: &Value) {
    print_line(&serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

/// One line on stdout. A reader that went away (`| head`) ends the process quietly, as
/// Unix tools do, instead of a panic.
fn print_line(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("differently: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// The exit code of a client command that failed: the error on stderr, then 1 (2 for usage).
pub fn fail(e: &ClientError) -> ExitCode {
    eprintln!("differently: {e}");
    match e {
        ClientError::Usage(_) => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

/// `k=v` pairs from repeated flags, as a JSON object; the flag is named in the error.
pub fn pairs(flag: &str, items: &[String]) -> Result<serde_json::Map<String, Value>, ClientError> {
    let mut out = serde_json::Map::new();
    for item in items {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| ClientError::Usage(format!("--{flag} {item:?}: expected KEY=VALUE")))?;
        out.insert(k.to_owned(), Value::String(v.to_owned()));
    }
    Ok(out)
}

/// Percent-encodes a query value or a path segment (RFC 3986 unreserved characters pass).
pub fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
