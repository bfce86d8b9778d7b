//! How answers are printed: JSON, a table, or ids; a spinner on stderr while waiting (only
//! on a terminal). A reader that went away (`| head`) ends the process quietly, as Unix
//! tools do, instead of a panic: exit 0, or exit 1 when the command has already failed
//! ([`failed_if_reader_goes`]).

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::CliError;

/// How an answer is printed.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    Table,
    Id,
}

/// Prints answers one way.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    pub output: Output,
}

/// A table column: its header and the field it shows (`a/b` for a nested one).
pub type Column = (&'static str, &'static str);

impl Printer {
    pub fn new(output: Output) -> Printer {
        Printer { output }
    }

    /// One object (or a `{items}` list) with these table columns.
    pub fn print(&self, v: &Value, columns: &[Column]) -> Result<(), CliError> {
        match self.output {
            Output::Json => {
                print_line(&serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
                Ok(())
            }
            Output::Id => {
                let ids: Vec<&str> = match v.get("items").and_then(Value::as_array) {
                    Some(items) => items.iter().filter_map(|i| i["id"].as_str()).collect(),
                    None => v["id"].as_str().into_iter().collect(),
                };
                if ids.is_empty() && v.get("items").is_none() {
                    return Err(CliError::Outcome(
                        "the answer has no id (use -o json)".into(),
                    ));
                }
                ids.iter().for_each(|id| print_line(id));
                Ok(())
            }
            Output::Table => {
                match v.get("items").and_then(Value::as_array) {
                    Some(items) => print_table(items, columns),
                    None => print_fields(v),
                }
                Ok(())
            }
        }
    }

    /// A list of items (already gathered from every page).
    pub fn print_list(&self, items: Vec<Value>, columns: &[Column]) -> Result<(), CliError> {
        self.print(&serde_json::json!({ "items": items }), columns)
    }
}

/// `field` of `v`, `a/b` reaching into objects.
fn field<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('/').fold(v, |v, k| &v[k])
}

/// A cell's text: strings as they are, `-` for null, other values as compact JSON.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::Object(m) if m.is_empty() => "-".to_owned(),
        Value::Array(a) if a.is_empty() => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Object(m) if m.values().all(|x| x.is_string()) && !m.is_empty() => m
            .iter()
            .map(|(k, x)| format!("{k}={}", x.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(","),
        Value::Array(a) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

/// Rows under headers, columns padded to their widest cell.
pub fn print_table(items: &[Value], columns: &[Column]) {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| columns.iter().map(|(_, f)| cell(field(i, f))).collect())
        .collect();
    let headers: Vec<String> = columns.iter().map(|(h, _)| (*h).to_owned()).collect();
    print_rows(&headers, &rows);
}

/// Rows of text, padded.
pub fn print_rows(headers: &[String], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out
    };
    print_line(&line(headers));
    for r in rows {
        print_line(&line(r));
    }
}

/// One object as `FIELD  VALUE` lines.
fn print_fields(v: &Value) {
    let Some(m) = v.as_object() else {
        print_line(&cell(v));
        return;
    };
    let rows: Vec<Vec<String>> = m.iter().map(|(k, x)| vec![k.clone(), cell(x)]).collect();
    print_rows(&["FIELD".to_owned(), "VALUE".to_owned()], &rows);
}

/// One line on stdout; a closed pipe ends the process quietly (exit 0, or 1 after
/// [`failed_if_reader_goes`]).
pub fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
        exit_on_write_error(&e);
    }
}

/// Raw bytes on `w` (stdout or stderr), flushed; a closed pipe ends the process quietly.
pub fn write_raw(w: &mut impl Write, bytes: &[u8]) {
    if let Err(e) = w.write_all(bytes).and_then(|()| w.flush()) {
        exit_on_write_error(&e);
    }
}

/// Set once the command knows it failed, before it prints its answer: what a closed pipe
/// then says on stderr, with exit 1. See [`failed_if_reader_goes`].
static FAILED: OnceLock<String> = OnceLock::new();

/// Says that this command has failed, for the case its reader goes away while the answer is
/// printed (`differently audit verify FILE | head`): the process then ends with
/// `differently: {message}` on stderr and exit 1, as the failure does with the reader
/// there. Without it a closed pipe ends the process quietly with exit 0, which for a failed
/// verification, preflight or wait would read as success. Called before printing; the
/// first message wins.
pub fn failed_if_reader_goes(message: impl Into<String>) {
    let _ = FAILED.set(message.into());
}

fn exit_on_write_error(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        if let Some(message) = FAILED.get() {
            eprintln!("differently: {message}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    eprintln!("differently: cannot write the output: {e}");
    std::process::exit(1);
}

/// A spinner on stderr while a wait lasts, only when stderr is a terminal (never in a
/// script's logs). Dropping it clears its line.
pub struct Spinner {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Spinner {
    /// Shows that the command waits for sandbox `id` to be `status`, for up to `seconds`: a
    /// spinner on a terminal; otherwise one line on stderr, so a script's log says why it is
    /// quiet (stdout keeps only the answer).
    pub fn waiting(id: &str, status: &str, seconds: u64) -> Spinner {
        if std::io::stderr().is_terminal() {
            return Spinner::start(format!(
                "waiting for {id} to be {status} (up to {seconds}s)"
            ));
        }
        eprintln!("differently: waiting up to {seconds}s for sandbox {id} to be {status}…");
        Spinner { task: None }
    }

    pub fn start(message: String) -> Spinner {
        if !std::io::stderr().is_terminal() {
            return Spinner { task: None };
        }
        let task = tokio::spawn(async move {
            const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            let start = Instant::now();
            for i in 0usize.. {
                {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(
                        err,
                        "\r{} {message} ({}s)",
                        FRAMES[i % FRAMES.len()],
                        start.elapsed().as_secs()
                    );
                    let _ = err.flush();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Spinner { task: Some(task) }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn cells_are_plain_text() {
        assert_eq!(cell(&json!(null)), "-");
        assert_eq!(cell(&json!("running")), "running");
        assert_eq!(cell(&json!({"a": "1", "b": "2"})), "a=1,b=2");
        assert_eq!(cell(&json!(["x", "y"])), "x,y");
        assert_eq!(cell(&json!(3)), "3");
        assert_eq!(field(&json!({"a": {"b": 7}}), "a/b"), &json!(7));
    }
}
