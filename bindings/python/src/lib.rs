//! The Python module `abridge._abridge`: the engine's store, runner and read
//! API for asyncio hosts. Nothing of the engine is re-implemented here: each
//! method hands its work to the engine on a Tokio runtime (the GIL released
//! while it runs) and returns an awaitable; a host's model is a Python async
//! callable, awaited on the host's own event loop.

use abridge::compaction::{CompactionConfig, Threshold};
use abridge::inspect::ExportFormat;
use abridge::message::{ModelRequest, ModelResponse};
use abridge::model::{ModelClient, ModelError};
use abridge::{
    Approval, CallId, Decision, Error, Runner as EngineRunner, SessionId, Store as EngineStore,
    ToolCall, ToolError, ToolSpec, Tools, TurnId,
};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

create_exception!(
    _abridge,
    AbridgeError,
    PyException,
    "An error of the abridge engine."
);
create_exception!(
    _abridge,
    LeaseLost,
    AbridgeError,
    "Another runner took the turn over: its writes were refused. Resumable."
);
create_exception!(
    _abridge,
    LeaseHeld,
    AbridgeError,
    "A live runner holds the turn. Resumable later."
);
create_exception!(
    _abridge,
    SessionDeleted,
    AbridgeError,
    "The session was deleted."
);
create_exception!(
    _abridge,
    ContextOverflow,
    AbridgeError,
    "The context cannot be made to fit the model's window."
);
create_exception!(
    _abridge,
    TurnParked,
    AbridgeError,
    "The session's turn waits for a decision: decide its calls and resume it."
);
create_exception!(
    _abridge,
    TurnRunning,
    AbridgeError,
    "The session has a turn running (a crash left it, or another task runs it): resume it first."
);
create_exception!(
    _abridge,
    AlreadyDecided,
    AbridgeError,
    "The call was decided already; the first decision wins."
);
create_exception!(
    _abridge,
    NotFound,
    AbridgeError,
    "No such session, turn, step or call."
);
create_exception!(
    _abridge,
    ModelFailed,
    AbridgeError,
    "The model failed the step (after its retries)."
);
create_exception!(
    _abridge,
    StoreError,
    AbridgeError,
    "The store refused: not a store, a newer schema, a busy or unreachable database."
);

/// The engine's error as the matching exception class; `resumable` in its
/// arguments says whether running the turn again can succeed.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::LeaseLost { .. } => LeaseLost::new_err(msg),
        Error::LeaseHeld { .. } => LeaseHeld::new_err(msg),
        Error::SessionDeleted { .. } | Error::TurnDeleted { .. } => SessionDeleted::new_err(msg),
        Error::ContextOverflow { .. } => ContextOverflow::new_err(msg),
        Error::TurnParked { .. } => TurnParked::new_err(msg),
        Error::TurnRunning { .. } => TurnRunning::new_err(msg),
        Error::AlreadyDecided { .. } => AlreadyDecided::new_err(msg),
        Error::UnknownSession(_) | Error::UnknownTurn(_) | Error::UnknownCall { .. } => {
            NotFound::new_err(msg)
        }
        Error::Model { .. } | Error::EmptyResponse { .. } | Error::InvalidResponse { .. } => {
            ModelFailed::new_err(msg)
        }
        Error::NotADatabase { .. }
        | Error::ForeignDatabase { .. }
        | Error::SchemaTooNew { .. }
        | Error::PoolTimeout { .. }
        | Error::Unreachable { .. } => StoreError::new_err(msg),
        _ => AbridgeError::new_err(msg),
    }
}

/// JSON text as a Python object (`json.loads`).
fn from_json(py: Python<'_>, text: &str) -> PyResult<PyObject> {
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (text,))?.unbind())
}

/// A Python object as JSON text (`json.dumps`).
fn to_json(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let json = obj.py().import("json")?;
    json.call_method1("dumps", (obj,))?.extract()
}

/// A serialisable engine value as a Python object.
fn to_py<T: serde::Serialize>(py: Python<'_>, v: &T) -> PyResult<PyObject> {
    let text = serde_json::to_string(v).map_err(|e| AbridgeError::new_err(e.to_string()))?;
    from_json(py, &text)
}

/// An awaitable of `fut`'s value, as a Python object (through JSON): the
/// shape of every method that reads or writes rows.
fn awaitable<'py, T, F>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    T: serde::Serialize + Send + 'static,
    F: std::future::Future<Output = abridge::Result<T>> + Send + 'static,
{
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let v = fut.await.map_err(py_err)?;
        Python::with_gil(|py| to_py(py, &v))
    })
}

/// A store: an SQLite file (created if missing) or a `postgres://` URL.
#[pyclass(module = "abridge._abridge", frozen)]
#[derive(Clone)]
struct Store {
    inner: EngineStore,
}

#[pymethods]
impl Store {
    /// Opens (creating, migrating) the store at `path_or_url`. `key`: the
    /// passphrase of an encrypted store (a package built with the
    /// `encryption` feature; any other build refuses a key).
    #[staticmethod]
    #[pyo3(signature = (path_or_url, *, key = None))]
    fn open(py: Python<'_>, path_or_url: String, key: Option<String>) -> PyResult<Store> {
        let inner = py
            .allow_threads(|| {
                let mut opts = abridge::StoreOptions::default();
                if let Some(k) = key {
                    opts = opts.with_key(abridge::store::Key::passphrase(k)?);
                }
                EngineStore::open_with(path_or_url.as_str(), opts)
            })
            .map_err(py_err)?;
        Ok(Store { inner })
    }

    /// What the session's next turn reads (a dict): `compaction` (the newest
    /// completed one, or None), `summary_message` (the text that stands for
    /// it in every step's messages) and `turns` (those after it).
    fn view<'py>(&self, py: Python<'py>, session_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.view(SessionId(session_id)).await })
    }

    /// A session's pinned facts (dicts), oldest first.
    fn pins<'py>(&self, py: Python<'py>, session_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.pins(SessionId(session_id)).await })
    }

    /// Deletes a session whole (every row of it, in one transaction; the
    /// deletion is recorded): a dict of the rows removed.
    fn delete_session<'py>(
        &self,
        py: Python<'py>,
        key: SessionKeyArg,
    ) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.delete_session(key.0).await })
    }

    /// Makes `new_id` a fork of the session at turn `at_turn`: a new
    /// session (a dict) whose history is the session's turns up to and
    /// including `at_turn`, read where they are (nothing is copied), then its
    /// own. The session is unchanged; only a completed turn is a fork point.
    fn fork<'py>(
        &self,
        py: Python<'py>,
        key: SessionKeyArg,
        at_turn: i64,
        new_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.fork(key.0, at_turn, &new_id).await })
    }

    /// The sessions (dicts) that hang off the session: its forks and its
    /// delegated children, oldest first.
    fn children<'py>(&self, py: Python<'py>, key: SessionKeyArg) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.children(key.0).await })
    }

    /// The session (a dict) by its id or external id.
    fn session<'py>(&self, py: Python<'py>, key: SessionKeyArg) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.session(key.0).await })
    }

    /// A session's turns (dicts), in order.
    fn turns<'py>(&self, py: Python<'py>, session_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.turns(SessionId(session_id)).await })
    }

    /// A turn's steps (dicts), in order.
    fn steps<'py>(&self, py: Python<'py>, turn_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move { store.steps(TurnId(turn_id)).await })
    }

    /// A session's compactions (dicts), oldest first.
    fn compactions<'py>(&self, py: Python<'py>, session_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(
            py,
            async move { store.compactions(SessionId(session_id)).await },
        )
    }

    /// A session's full, uncompacted transcript (`markdown` or `jsonl`).
    #[pyo3(signature = (key, format = "markdown"))]
    fn export<'py>(
        &self,
        py: Python<'py>,
        key: SessionKeyArg,
        format: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let format = match format {
            "markdown" | "md" => ExportFormat::Markdown,
            "jsonl" => ExportFormat::Jsonl,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "format must be markdown or jsonl, not {other:?}"
                )))
            }
        };
        let store = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            store.export(key.0, format).await.map_err(py_err)
        })
    }

    /// Rebuilds an executed step's messages (G3): a dict with `sha256`,
    /// `recorded` and `holds`.
    fn rebuild_step<'py>(&self, py: Python<'py>, step_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let r = store
                .call(move |c| abridge::replay::rebuild_step(c, abridge::StepId(step_id)))
                .await
                .map_err(py_err)?;
            Python::with_gil(|py| {
                let d = PyDict::new(py);
                d.set_item("sha256", &r.sha256)?;
                d.set_item("recorded", &r.recorded)?;
                d.set_item("holds", r.holds())?;
                Ok(d.unbind().into_any())
            })
        })
    }

    /// Checks the guarantees G1-G8 on the whole store: a dict with `ok`,
    /// `checks` and `notes`.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let store = self.inner.clone();
        awaitable(py, async move {
            store.call(|c| abridge::verify::verify(c)).await
        })
    }
}

/// A provider's client, the engine's own (`abridge.providers`): a
/// runner's `model`, or its `summariser` with a `summary_model`.
#[pyclass(module = "abridge._abridge", frozen, subclass)]
#[derive(Clone)]
struct Provider {
    client: Arc<dyn ModelClient>,
    kind: &'static str,
}

impl Provider {
    fn new(client: impl ModelClient + 'static, kind: &'static str) -> Provider {
        Provider {
            client: Arc::new(client),
            kind,
        }
    }
}

#[pymethods]
impl Provider {
    fn __repr__(&self) -> String {
        format!("abridge.providers.{}(...)", self.kind)
    }
}

/// The HTTP options and key of a provider built from Python: the given
/// `base_url` and `api_key`, else the provider's usual variables.
fn http_options(
    base_url: Option<String>,
    default_base: &str,
    headers: Option<std::collections::HashMap<String, String>>,
    timeout_s: Option<f64>,
) -> PyResult<abridge::providers::HttpOptions> {
    let mut o = abridge::providers::HttpOptions::new(base_url.unwrap_or(default_base.into()));
    for (k, v) in headers.unwrap_or_default() {
        o = o.with_header(k, v);
    }
    if let Some(t) = timeout_s {
        if !(t.is_finite() && t > 0.0) {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ));
        }
        o = o.with_timeout(std::time::Duration::from_secs_f64(t));
    }
    Ok(o)
}

fn required_key(given: Option<String>, var: &str) -> PyResult<abridge::providers::ApiKey> {
    match given {
        Some(k) => Ok(abridge::providers::ApiKey::new(k)),
        None => abridge::providers::ApiKey::from_env(var).map_err(py_err),
    }
}

fn env_base(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// OpenAI's Chat Completions API (and the servers that speak it). Without
/// arguments: `OPENAI_API_KEY` and `OPENAI_BASE_URL`, as OpenAI's SDKs read
/// them.
#[pyclass(module = "abridge._abridge", frozen, extends = Provider)]
struct OpenAIChat;

#[pymethods]
impl OpenAIChat {
    #[new]
    #[pyo3(signature = (*, api_key = None, base_url = None, headers = None, timeout = None))]
    fn new(
        api_key: Option<String>,
        base_url: Option<String>,
        headers: Option<std::collections::HashMap<String, String>>,
        timeout: Option<f64>,
    ) -> PyResult<(Self, Provider)> {
        let (opts, key) = openai_options(api_key, base_url, headers, timeout)?;
        let client = abridge::providers::OpenAiChat::new(opts, key).map_err(py_err)?;
        Ok((OpenAIChat, Provider::new(client, "OpenAIChat")))
    }
}

/// What both OpenAI clients are built from: the given values, else
/// `OPENAI_BASE_URL` and `OPENAI_API_KEY` (none for a local server that
/// wants none).
fn openai_options(
    api_key: Option<String>,
    base_url: Option<String>,
    headers: Option<std::collections::HashMap<String, String>>,
    timeout: Option<f64>,
) -> PyResult<(
    abridge::providers::HttpOptions,
    Option<abridge::providers::ApiKey>,
)> {
    use abridge::providers::{openai_base_url, ApiKey, OpenAiChat};
    let base = base_url.or_else(|| env_base("OPENAI_BASE_URL"));
    let opts = http_options(
        base.map(|b| openai_base_url(&b)),
        OpenAiChat::DEFAULT_BASE_URL,
        headers,
        timeout,
    )?;
    let key = api_key
        .map(ApiKey::new)
        .or_else(|| ApiKey::from_env("OPENAI_API_KEY").ok());
    Ok((opts, key))
}

/// The model of a host that runs its own model loop and records what it
/// did (`abridge.agents.AbridgeSession`): each turn is one step whose
/// response is the word `recorded`; no Python runs for it. The turn's input
/// holds what was recorded; the step exists so that the threshold, the
/// compaction claim and the rebuild apply to the recording as to any turn.
#[pyclass(module = "abridge._abridge", frozen, extends = Provider)]
struct Recorder;

struct RecorderClient;

#[abridge::async_trait]
impl ModelClient for RecorderClient {
    async fn complete(&self, _request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        Ok(ModelResponse {
            blocks: vec![abridge::ResponseBlock::Text {
                text: "recorded".into(),
            }],
            usage: Default::default(),
            stop_reason: None,
            model: None,
        })
    }
}

#[pymethods]
impl Recorder {
    #[new]
    fn new() -> (Self, Provider) {
        (Recorder, Provider::new(RecorderClient, "Recorder"))
    }
}

/// OpenAI's Responses API. Without arguments: `OPENAI_API_KEY` and
/// `OPENAI_BASE_URL`.
#[pyclass(module = "abridge._abridge", frozen, extends = Provider)]
struct OpenAIResponses;

#[pymethods]
impl OpenAIResponses {
    #[new]
    #[pyo3(signature = (*, api_key = None, base_url = None, headers = None, timeout = None))]
    fn new(
        api_key: Option<String>,
        base_url: Option<String>,
        headers: Option<std::collections::HashMap<String, String>>,
        timeout: Option<f64>,
    ) -> PyResult<(Self, Provider)> {
        let (opts, key) = openai_options(api_key, base_url, headers, timeout)?;
        let client = abridge::providers::OpenAiResponses::new(opts, key).map_err(py_err)?;
        Ok((OpenAIResponses, Provider::new(client, "OpenAIResponses")))
    }
}

/// Anthropic's Messages API. Without arguments: `ANTHROPIC_API_KEY` (which
/// it needs) and `ANTHROPIC_BASE_URL` (the API's root, as Anthropic's SDKs
/// read it).
#[pyclass(module = "abridge._abridge", frozen, extends = Provider)]
struct Anthropic;

#[pymethods]
impl Anthropic {
    #[new]
    #[pyo3(signature = (*, api_key = None, base_url = None, headers = None, timeout = None, max_tokens = None))]
    fn new(
        api_key: Option<String>,
        base_url: Option<String>,
        headers: Option<std::collections::HashMap<String, String>>,
        timeout: Option<f64>,
        max_tokens: Option<u32>,
    ) -> PyResult<(Self, Provider)> {
        use abridge::providers::{anthropic_base_url, Anthropic as Client};
        let base = base_url.or_else(|| env_base("ANTHROPIC_BASE_URL"));
        let opts = http_options(
            base.map(|b| anthropic_base_url(&b)),
            Client::DEFAULT_BASE_URL,
            headers,
            timeout,
        )?;
        let key = required_key(api_key, "ANTHROPIC_API_KEY")?;
        let mut client = Client::new(opts, key).map_err(py_err)?;
        if let Some(n) = max_tokens {
            client = client.with_max_tokens(n);
        }
        Ok((Anthropic, Provider::new(client, "Anthropic")))
    }
}

/// A session named by its row id (an int) or its external id (a str).
struct SessionKeyArg(abridge::SessionKey);

impl<'py> FromPyObject<'py> for SessionKeyArg {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(id) = ob.extract::<i64>() {
            return Ok(SessionKeyArg(abridge::SessionKey::Id(SessionId(id))));
        }
        let ext: String = ob.extract()?;
        Ok(SessionKeyArg(abridge::SessionKey::External(ext)))
    }
}

/// A model that is a Python async callable: it gets the request as a dict
/// (`model`, `messages`, `tools`) and returns the response as a dict
/// (`blocks`: `{"type": "text", "text": ...}` or `{"type": "tool_use",
/// "id": ..., "name": ..., "input": {...}}`; `usage`: `input_tokens`,
/// `output_tokens`). It is awaited on the event loop of the call that runs
/// the turn.
struct PyModel {
    callable: PyObject,
}

#[abridge::async_trait]
impl ModelClient for PyModel {
    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = serde_json::json!({
            "model": request.model,
            "messages": &*request.messages,
            "tools": request.tools,
        })
        .to_string();
        let awaited = Python::with_gil(|py| -> PyResult<_> {
            let locals = pyo3_async_runtimes::tokio::get_current_locals(py)?;
            let req = from_json(py, &body)?;
            let coro = self.callable.bind(py).call1((req,))?;
            pyo3_async_runtimes::into_future_with_locals(&locals, coro)
        })
        .map_err(|e| ModelError::Permanent(format!("the model callable failed: {e}")))?;
        let out = awaited
            .await
            .map_err(|e| ModelError::Transient(format!("the model callable raised: {e}")))?;
        let text = Python::with_gil(|py| to_json(out.bind(py)))
            .map_err(|e| ModelError::Permanent(format!("the model's answer is not JSON: {e}")))?;
        serde_json::from_str(&text).map_err(|e| {
            ModelError::Permanent(format!("the model's answer is not a response: {e}"))
        })
    }
}

/// A tool the model may call: `fn` is a Python callable (sync or async)
/// taking the call's arguments (a dict) and the call (a dict with
/// `idempotency_key`, `session`, `turn`, `step`, `id`, `name`), returning
/// a JSON-able result (a str as it is); raising gives the model an error
/// result with the exception's message. `effect`: `idempotent` (called
/// again with the same key after a crash), `at_most_once` (never called
/// twice: a crash mid-call is reported to the model as an unknown outcome)
/// or `deferred` (no code runs: its result is delivered, `Runner.decide`).
#[pyclass(module = "abridge._abridge", frozen)]
#[derive(Clone)]
struct Tool {
    spec: ToolSpec,
    effect: String,
    func: Option<Arc<PyObject>>,
}

#[pymethods]
impl Tool {
    #[new]
    #[pyo3(signature = (name, fn_ = None, *, description = String::new(), input_schema = None, effect = "idempotent".to_string()))]
    fn new(
        name: String,
        fn_: Option<PyObject>,
        description: String,
        input_schema: Option<&Bound<'_, PyAny>>,
        effect: String,
    ) -> PyResult<Tool> {
        let schema = match input_schema {
            Some(s) => serde_json::from_str(&to_json(s)?)
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?,
            None => serde_json::json!({"type": "object"}),
        };
        if let (Some(f), "transactional") = (&fn_, effect.as_str()) {
            let is_async: bool = Python::with_gil(|py| -> PyResult<bool> {
                py.import("inspect")?
                    .call_method1("iscoroutinefunction", (f.bind(py),))?
                    .extract()
            })?;
            if is_async {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "tool {name}: a transactional tool's function is sync (it runs inside the step's transaction)"
                )));
            }
        }
        match (effect.as_str(), &fn_) {
            ("idempotent" | "at_most_once" | "transactional", Some(_)) | ("deferred", None) => {}
            ("idempotent" | "at_most_once" | "transactional", None) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "tool {name}: an {effect} tool needs a function"
                )))
            }
            ("deferred", Some(_)) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "tool {name}: a deferred tool has no function (its result is delivered)"
                )))
            }
            (other, _) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "tool {name}: effect must be idempotent, at_most_once, transactional or deferred, not {other:?}"
            )))
            }
        }
        Ok(Tool {
            spec: ToolSpec {
                name,
                description,
                input_schema: schema,
            },
            effect,
            func: fn_.map(Arc::new),
        })
    }

    /// The tool's name.
    #[getter]
    fn name(&self) -> &str {
        &self.spec.name
    }
}

/// A Python tool function under the engine's `Tool` trait.
struct PyTool {
    func: Arc<PyObject>,
}

#[abridge::async_trait]
impl abridge::Tool for PyTool {
    async fn call(&self, call: &ToolCall) -> Result<serde_json::Value, ToolError> {
        let err = |e: PyErr| ToolError::new(Python::with_gil(|py| e.value(py).to_string()));
        // A coroutine is awaited on the host's loop; a plain value is the result.
        let called = Python::with_gil(|py| -> PyResult<Result<PyObject, _>> {
            let out = self.func.bind(py).call1(call_args(py, call)?)?;
            if out.hasattr("__await__")? {
                let locals = pyo3_async_runtimes::tokio::get_current_locals(py)?;
                return Ok(Err(pyo3_async_runtimes::into_future_with_locals(
                    &locals, out,
                )?));
            }
            Ok(Ok(out.unbind()))
        })
        .map_err(err)?;
        let value = match called {
            Ok(v) => v,
            Err(fut) => fut.await.map_err(err)?,
        };
        let text = Python::with_gil(|py| to_json(value.bind(py))).map_err(err)?;
        serde_json::from_str(&text).map_err(|e| ToolError::new(e.to_string()))
    }
}

/// The arguments and the call of a tool's invocation, as Python objects.
fn call_args(py: Python<'_>, call: &ToolCall) -> PyResult<(PyObject, PyObject)> {
    let meta = serde_json::json!({
        "idempotency_key": call.idempotency_key,
        "session": call.session,
        "turn": call.turn_idx,
        "step": call.step_idx,
        "id": call.tool_call_id,
        "name": call.name,
    })
    .to_string();
    Ok((
        from_json(py, &call.input.to_string())?,
        from_json(py, &meta)?,
    ))
}

/// The step's own transaction, for a transactional tool's function while it
/// runs (and refused after): `execute(sql, params)` and `query(sql, params)`,
/// the SQL of the store's backend, `?` placeholders.
#[pyclass(module = "abridge._abridge", frozen)]
struct Transaction {
    /// The transaction's address and the thread the tool runs on, set only
    /// while the tool's function runs (see `PyTransactionalTool`).
    tx: std::sync::Mutex<Option<(usize, std::thread::ThreadId)>>,
}

/// A Python value as an SQL value.
fn sql_value(v: &Bound<'_, PyAny>) -> PyResult<abridge::rusqlite::types::Value> {
    use abridge::rusqlite::types::Value;
    if v.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = v.downcast::<pyo3::types::PyBool>() {
        return Ok(Value::Integer(b.is_true() as i64));
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(Value::Integer(i));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(Value::Real(f));
    }
    if let Ok(s) = v.extract::<String>() {
        return Ok(Value::Text(s));
    }
    if let Ok(b) = v.extract::<Vec<u8>>() {
        return Ok(Value::Blob(b));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "an SQL parameter is None, an int, a float, a str or bytes, not {}",
        v.get_type().name()?
    )))
}

impl Transaction {
    fn with<R>(
        &self,
        f: impl FnOnce(&abridge::store::Transaction<'_>) -> PyResult<R>,
    ) -> PyResult<R> {
        let slot = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match *slot {
            // SAFETY: the address is set by `PyTransactionalTool::call` to the
            // transaction it was lent, and cleared (under this lock) before
            // that call returns, so the transaction outlives every use; it is
            // used only on the thread that holds it.
            Some((addr, thread)) if thread == std::thread::current().id() => {
                f(unsafe { &*(addr as *const abridge::store::Transaction<'_>) })
            }
            Some(_) => Err(AbridgeError::new_err(
                "the transaction is used only on the thread its tool runs on",
            )),
            None => Err(AbridgeError::new_err(
                "the transaction is over: a handle is good only while its tool runs",
            )),
        }
    }

    fn params(params: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<abridge::rusqlite::types::Value>> {
        match params {
            None => Ok(Vec::new()),
            Some(p) if p.is_none() => Ok(Vec::new()),
            Some(p) => p.try_iter()?.map(|v| sql_value(&v?)).collect(),
        }
    }
}

#[pymethods]
impl Transaction {
    /// Runs one statement; the number of rows it changed.
    #[pyo3(signature = (sql, params = None))]
    fn execute(&self, sql: &str, params: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let values = Self::params(params)?;
        self.with(|tx| {
            let refs: Vec<&dyn abridge::rusqlite::ToSql> = values
                .iter()
                .map(|v| v as &dyn abridge::rusqlite::ToSql)
                .collect();
            tx.execute(sql, refs.as_slice()).map_err(py_err)
        })
    }

    /// Runs a query; its rows, each a tuple of None, int, float, str or bytes.
    #[pyo3(signature = (sql, params = None))]
    fn query(
        &self,
        py: Python<'_>,
        sql: &str,
        params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<PyObject>> {
        use abridge::rusqlite::types::Value;
        let values = Self::params(params)?;
        let rows: Vec<Vec<Value>> = self.with(|tx| {
            let refs: Vec<&dyn abridge::rusqlite::ToSql> = values
                .iter()
                .map(|v| v as &dyn abridge::rusqlite::ToSql)
                .collect();
            let mut st = tx.prepare(sql).map_err(py_err)?;
            let mut rows = st.query(refs.as_slice()).map_err(py_err)?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(py_err)? {
                let mut vals = Vec::new();
                for i in 0.. {
                    match row.get::<usize, Value>(i) {
                        Ok(v) => vals.push(v),
                        Err(abridge::rusqlite::Error::InvalidColumnIndex(_)) => break,
                        Err(e) => return Err(AbridgeError::new_err(e.to_string())),
                    }
                }
                out.push(vals);
            }
            Ok(out)
        })?;
        rows.into_iter()
            .map(|vals| {
                let items: Vec<PyObject> = vals
                    .into_iter()
                    .map(|v| -> PyResult<PyObject> {
                        Ok(match v {
                            Value::Null => py.None(),
                            Value::Integer(i) => i.into_pyobject(py)?.into_any().unbind(),
                            Value::Real(f) => f.into_pyobject(py)?.into_any().unbind(),
                            Value::Text(s) => s.into_pyobject(py)?.into_any().unbind(),
                            Value::Blob(b) => pyo3::types::PyBytes::new(py, &b).into_any().unbind(),
                        })
                    })
                    .collect::<PyResult<_>>()?;
                Ok(pyo3::types::PyTuple::new(py, items)?.into_any().unbind())
            })
            .collect()
    }
}

/// A Python function as a transactional tool: `fn(tx, args, call)`, sync,
/// run inside the transaction that records the call completed, so its
/// writes commit with that record or not at all.
struct PyTransactionalTool {
    func: Arc<PyObject>,
}

impl abridge::TransactionalTool for PyTransactionalTool {
    fn call(
        &self,
        tx: &abridge::store::Transaction<'_>,
        call: &ToolCall,
    ) -> Result<serde_json::Value, ToolError> {
        let err = |e: PyErr| ToolError::new(Python::with_gil(|py| e.value(py).to_string()));
        Python::with_gil(|py| -> Result<serde_json::Value, ToolError> {
            // The lifetime erased: see `Transaction::with` for why it holds.
            let addr = tx as *const abridge::store::Transaction<'_> as usize;
            let handle = Py::new(
                py,
                Transaction {
                    tx: std::sync::Mutex::new(Some((addr, std::thread::current().id()))),
                },
            )
            .map_err(err)?;
            let (args, meta) = call_args(py, call).map_err(err)?;
            let out = self.func.bind(py).call1((handle.clone_ref(py), args, meta));
            // The handle is good only while the function runs.
            *handle.get().tx.lock().unwrap_or_else(|e| e.into_inner()) = None;
            let out = out.map_err(err)?;
            if out.hasattr("__await__").map_err(err)? {
                let _ = out.call_method0("close");
                return Err(ToolError::new(
                    "a transactional tool's function is sync: it runs inside the step's transaction",
                ));
            }
            let text = to_json(&out).map_err(err)?;
            serde_json::from_str(&text).map_err(|e| ToolError::new(e.to_string()))
        })
    }
}

/// A call's parked row, or the engine's decision from a Python one.
fn decision(
    what: &str,
    reason: Option<String>,
    input: Option<&Bound<'_, PyAny>>,
    always: bool,
    result: Option<String>,
    ok: bool,
) -> PyResult<Decision> {
    Ok(match what {
        "approve" => Decision::Approve {
            input: match input {
                Some(v) if !v.is_none() => Some(
                    serde_json::from_str(&to_json(v)?)
                        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?,
                ),
                _ => None,
            },
            always,
        },
        "reject" => Decision::reject(reason.unwrap_or_default()),
        "deliver" => Decision::Deliver {
            result: result.unwrap_or_default(),
            ok,
        },
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a decision is approve, reject or deliver, not {other:?}"
            )))
        }
    })
}

/// The runner's events, as an async iterator of dicts (`event` names the
/// kind; `session`, `turn` and the kind's fields beside it).
#[pyclass(module = "abridge._abridge")]
struct Events {
    rx: Arc<tokio::sync::Mutex<tokio::sync::broadcast::Receiver<abridge::Event>>>,
}

#[pymethods]
impl Events {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let rx = self.rx.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            loop {
                let got = rx.lock().await.recv().await;
                match got {
                    Ok(e) => return Python::with_gil(|py| to_py(py, &e)),
                    // A subscriber far behind loses the oldest: go on.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Err(pyo3::exceptions::PyStopAsyncIteration::new_err(()))
                    }
                }
            }
        })
    }
}

/// Runs turns durably over a store with a model (a Python async callable).
#[pyclass(module = "abridge._abridge", frozen)]
struct Runner {
    inner: EngineRunner,
}

/// A setting given as a keyword and in `compaction=`.
fn both(key: &str) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!(
        "{key} is given twice: as a keyword and in compaction="
    ))
}

/// The settings of a runner's `compaction=` mapping.
#[derive(Default)]
struct CompactionArgs<'py> {
    dict: Option<Bound<'py, PyDict>>,
    compact_at: Option<Bound<'py, PyAny>>,
    summariser: Option<Arc<dyn ModelClient>>,
}

impl<'py> CompactionArgs<'py> {
    const KEYS: [&'static str; 7] = [
        "compact_at",
        "context_window",
        "model_name",
        "summariser",
        "summary_model",
        "keep_last_turns",
        "background",
    ];

    fn from_dict(d: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let Some(d) = d else {
            return Ok(Self::default());
        };
        for k in d.keys() {
            let k: String = k.extract()?;
            if !Self::KEYS.contains(&k.as_str()) {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "compaction= has no setting {k:?} (it takes {})",
                    Self::KEYS.join(", ")
                )));
            }
        }
        let summariser = match d.get_item("summariser")? {
            Some(p) if !p.is_none() => Some(
                p.downcast::<Provider>()
                    .map_err(|_| {
                        pyo3::exceptions::PyTypeError::new_err(
                            "compaction['summariser'] is a provider of abridge.providers",
                        )
                    })?
                    .get()
                    .client
                    .clone(),
            ),
            _ => None,
        };
        Ok(Self {
            compact_at: d.get_item("compact_at")?.filter(|v| !v.is_none()),
            summariser,
            dict: Some(d.clone()),
        })
    }

    /// The keyword's object, else the mapping's.
    fn pick(
        &self,
        key: &str,
        given: Option<&Bound<'py, PyAny>>,
        from_dict: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match (given.filter(|v| !v.is_none()), from_dict) {
            (Some(_), Some(_)) => Err(both(key)),
            (Some(g), None) => Ok(Some(g.clone())),
            (None, d) => Ok(d.cloned()),
        }
    }

    /// The keyword's value, else the mapping's.
    fn pick_value<T: for<'a> FromPyObject<'a>>(
        &self,
        key: &str,
        given: Option<T>,
    ) -> PyResult<Option<T>> {
        let from_dict = match &self.dict {
            Some(d) => match d.get_item(key)? {
                Some(v) if !v.is_none() => Some(v.extract::<T>()?),
                _ => None,
            },
            None => None,
        };
        match (given, from_dict) {
            (Some(_), Some(_)) => Err(both(key)),
            (g, d) => Ok(g.or(d)),
        }
    }
}

/// A threshold: a token count (int), a fraction of the window (float), or
/// None / "off".
fn threshold(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Threshold>> {
    let Some(v) = v else { return Ok(None) };
    if v.is_none() {
        return Ok(None);
    }
    if let Ok(n) = v.extract::<u64>() {
        return Ok(Some(Threshold::Tokens(n)));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(Some(Threshold::Fraction(f)));
    }
    let s: String = v.extract()?;
    Threshold::parse(&s).map(Some).map_err(py_err)
}

#[pymethods]
impl Runner {
    /// A runner over `store` calling `model`. `compact_at`: tokens (int), a
    /// fraction of the model's window (float) or "off"; `context_window`:
    /// the model's window in tokens, for a model abridge does not know.
    #[new]
    #[pyo3(signature = (store, model, *, tools = Vec::new(), approval = None, compact_at = None, context_window = None, model_name = None, summariser = None, summary_model = None, keep_last_turns = None, background = None, stream = false, compaction = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: &Store,
        model: &Bound<'_, PyAny>,
        tools: Vec<Tool>,
        approval: Option<&Bound<'_, PyAny>>,
        compact_at: Option<&Bound<'_, PyAny>>,
        context_window: Option<u64>,
        model_name: Option<String>,
        summariser: Option<PyRef<'_, Provider>>,
        summary_model: Option<String>,
        keep_last_turns: Option<u32>,
        background: Option<bool>,
        stream: bool,
        compaction: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Runner> {
        // `compaction={...}`: the same settings as a mapping, for a host that
        // keeps them together; a setting given both ways is refused.
        let settings = CompactionArgs::from_dict(compaction.as_ref())?;
        let compact_at = settings.pick("compact_at", compact_at, settings.compact_at.as_ref())?;
        let context_window = settings.pick_value("context_window", context_window)?;
        let model_name = settings.pick_value("model_name", model_name)?;
        let summary_model = settings.pick_value("summary_model", summary_model)?;
        let keep_last_turns = settings.pick_value("keep_last_turns", keep_last_turns)?;
        let background = settings
            .pick_value("background", background)?
            .unwrap_or(true);
        let summariser = match (summariser, settings.summariser) {
            (Some(_), Some(_)) => return Err(both("summariser")),
            (Some(p), None) => Some(p.client.clone()),
            (None, p) => p,
        };
        let mut registry = Tools::new();
        for t in tools {
            registry = match (t.effect.as_str(), t.func) {
                ("deferred", _) => registry.deferred(t.spec),
                ("at_most_once", Some(f)) => registry.at_most_once(t.spec, PyTool { func: f }),
                ("transactional", Some(f)) => {
                    registry.transactional(t.spec, PyTransactionalTool { func: f })
                }
                (_, Some(f)) => registry.idempotent(t.spec, PyTool { func: f }),
                (_, None) => registry,
            };
        }
        // `approval`: True for every tool, or the names of those that wait.
        let approval = match approval {
            None => Approval::none(),
            Some(a) if a.is_none() => Approval::none(),
            Some(a) => match a.extract::<bool>() {
                Ok(true) => Approval::all(),
                Ok(false) => Approval::none(),
                Err(_) => Approval::tools(a.extract::<Vec<String>>()?),
            },
        };
        let mut compaction = CompactionConfig::default();
        if let Some(t) = threshold(compact_at.as_ref())? {
            compaction = compaction.with_compact_at(t);
        }
        if let (Some(w), Some(m)) = (context_window, &model_name) {
            compaction = compaction.with_context_window(m, w);
        }
        if let Some(n) = keep_last_turns {
            compaction = compaction.with_keep_last_turns(n);
        }
        // Background compaction (at 80 % of the threshold, by a task of the
        // runner) is the engine's default; False compacts inline only.
        if !background {
            compaction = compaction.with_background(None);
        }
        // A built-in provider's client, or the Python callable.
        let model: Arc<dyn ModelClient> = match model.downcast::<Provider>() {
            Ok(p) => p.get().client.clone(),
            Err(_) if model.is_callable() => Arc::new(PyModel {
                callable: model.clone().unbind(),
            }),
            Err(_) => {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "model must be an abridge.providers client or an async callable",
                ))
            }
        };
        let summariser: Option<Arc<dyn abridge::Summariser>> =
            match (summariser, summary_model) {
                (None, None) => None,
                (Some(client), Some(m)) => Some(Arc::new(abridge::ModelSummariser::new(client, m))),
                _ => return Err(pyo3::exceptions::PyValueError::new_err(
                    "summariser and summary_model go together (neither: the offline summariser)",
                )),
            };
        let store = store.inner.clone();
        // Built inside the runtime: the runner starts its background tasks there.
        let inner = py.allow_threads(|| {
            let _rt = pyo3_async_runtimes::tokio::get_runtime().enter();
            let mut b = EngineRunner::builder(store, model)
                .tools(registry)
                .approval(approval)
                .compaction(compaction)
                .stream(stream);
            if let Some(s) = summariser {
                b = b.summariser_arc(s);
            }
            b.build()
        });
        Ok(Runner {
            inner: inner.map_err(py_err)?,
        })
    }

    /// Creates a session, or returns the one with this external id (a dict).
    fn create_session<'py>(
        &self,
        py: Python<'py>,
        external_id: String,
        model: String,
        system_prompt: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        awaitable(py, async move {
            runner
                .create_session(&external_id, &model, &system_prompt)
                .await
        })
    }

    /// Makes `new_id` a fork of the session at turn `at_turn` (see
    /// `Store.fork`), with this runner's pins window.
    fn fork<'py>(
        &self,
        py: Python<'py>,
        session_id: i64,
        at_turn: i64,
        new_id: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        awaitable(py, async move {
            runner.fork(SessionId(session_id), at_turn, &new_id).await
        })
    }

    /// Goes back to turn `turn` and says `input` instead, keeping the
    /// original: forks the session at `turn - 1` as `new_id` and runs the
    /// fork's turn `turn`. Returns `(fork, outcome)`.
    fn rewind<'py>(
        &self,
        py: Python<'py>,
        session_id: i64,
        turn: i64,
        new_id: String,
        input: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let (fork, out) = runner
                .rewind(SessionId(session_id), turn, &new_id, &input)
                .await
                .map_err(py_err)?;
            Python::with_gil(|py| Ok((to_py(py, &fork)?, outcome(py, &out)?)))
        })
    }

    /// Runs turn `idx` of the session to its end (or resumes it, or returns
    /// it as it ended): a dict with `output`, `steps`, `turn` and `pending`
    /// (the calls it is parked on, if any).
    fn run_turn_at<'py>(
        &self,
        py: Python<'py>,
        session_id: i64,
        idx: i64,
        input: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let out = runner
                .run_turn_at(SessionId(session_id), idx, &input)
                .await
                .map_err(py_err)?;
            Python::with_gil(|py| outcome(py, &out))
        })
    }

    /// Runs the session's next turn to its end: as `run_turn_at` with the
    /// index after its last turn.
    fn run_turn<'py>(
        &self,
        py: Python<'py>,
        session_id: i64,
        input: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let out = runner
                .run_turn(SessionId(session_id), &input)
                .await
                .map_err(py_err)?;
            Python::with_gil(|py| outcome(py, &out))
        })
    }

    /// Resumes a running turn (from any process) at its first incomplete step.
    fn resume_turn<'py>(&self, py: Python<'py>, turn_id: i64) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let out = runner.resume_turn(TurnId(turn_id)).await.map_err(py_err)?;
            Python::with_gil(|py| outcome(py, &out))
        })
    }

    /// The turns a crash left running that this process may resume (dicts).
    fn recoverable_turns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        awaitable(py, async move { runner.recoverable_turns().await })
    }

    /// Compacts the session now (manual), with an optional focus.
    #[pyo3(signature = (session_id, focus = None))]
    fn compact_now<'py>(
        &self,
        py: Python<'py>,
        session_id: i64,
        focus: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        awaitable(py, async move {
            runner.compact_now(SessionId(session_id), focus).await
        })
    }

    /// Takes a decision for a parked call, once: `approve` (optionally with
    /// edited `input`, or `always` for the tool in this session), `reject`
    /// (the model sees `reason`) or `deliver` (a deferred call's `result`).
    /// Returns the call's row; a second decision raises `AlreadyDecided`.
    #[pyo3(signature = (call, what, *, reason = None, input = None, always = false, result = None, ok = true, by = None))]
    #[allow(clippy::too_many_arguments)]
    fn decide<'py>(
        &self,
        py: Python<'py>,
        call: i64,
        what: &str,
        reason: Option<String>,
        input: Option<&Bound<'py, PyAny>>,
        always: bool,
        result: Option<String>,
        ok: bool,
        by: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let d = decision(what, reason, input, always, result, ok)?;
        let runner = self.inner.clone();
        awaitable(py, async move {
            runner.decide(CallId(call), d, by.as_deref()).await
        })
    }

    /// Abandons a parked turn (recorded): the session can take a new turn.
    fn abandon_turn<'py>(
        &self,
        py: Python<'py>,
        turn_id: i64,
        reason: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        awaitable(py, async move {
            runner.abandon_turn(TurnId(turn_id), &reason).await
        })
    }

    /// The calls that wait for a decision or a result (dicts), oldest first.
    #[pyo3(signature = (session_id = None))]
    fn pending_calls<'py>(
        &self,
        py: Python<'py>,
        session_id: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        awaitable(py, async move {
            runner
                .store()
                .pending_calls(session_id.map(SessionId))
                .await
        })
    }

    /// Pins a fact every later compaction carries (G8); `slot`: a newer
    /// value of the same slot supersedes it. Returns the turn it counts as
    /// stated in.
    #[pyo3(signature = (session_id, value, slot = None))]
    fn pin<'py>(
        &self,
        py: Python<'py>,
        session_id: i64,
        value: String,
        slot: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let fact = abridge::pins::Fact::host(slot.as_deref(), &value);
            runner
                .pin(SessionId(session_id), fact)
                .await
                .map_err(py_err)
        })
    }

    /// What a manual compaction would do now, writing nothing (a dict).
    #[pyo3(signature = (session_id, focus = None))]
    fn preview_compaction<'py>(
        &self,
        py: Python<'py>,
        session_id: i64,
        focus: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        awaitable(py, async move {
            runner
                .preview_compaction(SessionId(session_id), focus)
                .await
        })
    }

    /// The runner's events from now on, as an async iterator of dicts.
    fn events(&self) -> Events {
        Events {
            rx: Arc::new(tokio::sync::Mutex::new(self.inner.subscribe())),
        }
    }

    /// Waits for the summaries this runner started in the background.
    fn finish_background<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let runner = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            Ok(runner.finish_background().await)
        })
    }
}

fn outcome(py: Python<'_>, out: &abridge::TurnOutcome) -> PyResult<PyObject> {
    let d = PyDict::new(py);
    d.set_item("output", &out.output)?;
    d.set_item("steps", out.steps)?;
    d.set_item("turn", to_py(py, &out.turn)?)?;
    d.set_item("pending", to_py(py, &out.pending)?)?;
    d.set_item("parked", out.is_parked())?;
    Ok(d.unbind().into_any())
}

#[pymodule]
fn _abridge(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Store>()?;
    m.add_class::<Runner>()?;
    m.add_class::<Tool>()?;
    m.add_class::<Events>()?;
    m.add_class::<Provider>()?;
    m.add_class::<OpenAIChat>()?;
    m.add_class::<OpenAIResponses>()?;
    m.add_class::<Anthropic>()?;
    m.add_class::<Recorder>()?;
    m.add_class::<Transaction>()?;
    for (name, ty) in [
        ("AbridgeError", py.get_type::<AbridgeError>()),
        ("LeaseLost", py.get_type::<LeaseLost>()),
        ("LeaseHeld", py.get_type::<LeaseHeld>()),
        ("SessionDeleted", py.get_type::<SessionDeleted>()),
        ("ContextOverflow", py.get_type::<ContextOverflow>()),
        ("TurnParked", py.get_type::<TurnParked>()),
        ("AlreadyDecided", py.get_type::<AlreadyDecided>()),
        ("TurnRunning", py.get_type::<TurnRunning>()),
        ("NotFound", py.get_type::<NotFound>()),
        ("ModelFailed", py.get_type::<ModelFailed>()),
        ("StoreError", py.get_type::<StoreError>()),
    ] {
        m.add(name, ty)?;
    }
    Ok(())
}
