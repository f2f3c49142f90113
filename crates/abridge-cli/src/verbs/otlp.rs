//! OTLP export for `abridge chat` and `abridge demo` (feature `otel`): when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set, the runner's spans and metrics go there over OTLP/HTTP
//! (protobuf, or JSON with `OTEL_EXPORTER_OTLP_PROTOCOL=http/json`; the
//! other `OTEL_*` variables as the OpenTelemetry SDK reads them: headers,
//! timeout, `OTEL_SERVICE_NAME`, default `abridge`).

use crate::common::Failure;

/// The providers exporting; [`Exporting::finish`] flushes them.
#[cfg(feature = "otel")]
pub struct Exporting {
    tracer: opentelemetry_sdk::trace::SdkTracerProvider,
    meter: opentelemetry_sdk::metrics::SdkMeterProvider,
}

#[cfg(not(feature = "otel"))]
pub struct Exporting;

fn endpoint_set() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
}

/// The telemetry to give the runner, and what flushes it at the end; None
/// when no endpoint is set.
#[cfg(feature = "otel")]
pub fn from_env() -> Result<Option<(abridge::telemetry::Telemetry, Exporting)>, Failure> {
    if !endpoint_set() {
        return Ok(None);
    }
    // The exporters' blocking HTTP client is made (and later dropped) on a
    // thread of its own, outside the command's async runtime.
    let built = std::thread::spawn(build)
        .join()
        .map_err(|_| Failure::runtime("setting up the OTLP exporters panicked"))?;
    built.map(Some).map_err(Failure::runtime)
}

#[cfg(feature = "otel")]
fn build() -> Result<(abridge::telemetry::Telemetry, Exporting), String> {
    use opentelemetry_otlp::{MetricExporter, SpanExporter};
    use opentelemetry_sdk::Resource;
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "abridge".to_string());
    let resource = Resource::builder().with_service_name(service).build();
    let spans = SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("the OTLP span exporter: {e}"))?;
    let tracer = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .with_resource(resource.clone())
        .build();
    let metrics = MetricExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("the OTLP metric exporter: {e}"))?;
    let meter = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_periodic_exporter(metrics)
        .with_resource(resource)
        .build();
    let telemetry = abridge::telemetry::Telemetry::new(&tracer, &meter);
    Ok((telemetry, Exporting { tracer, meter }))
}

/// Without the feature: a set endpoint is said once, and nothing is sent.
#[cfg(not(feature = "otel"))]
pub fn from_env() -> Result<Option<((), Exporting)>, Failure> {
    if endpoint_set() {
        eprintln!("note: this abridge was built without the `otel` feature: nothing is exported");
    }
    Ok(None)
}

impl Exporting {
    /// Sends what is buffered and stops the exporters.
    pub fn finish(self) {
        #[cfg(feature = "otel")]
        {
            let Exporting { tracer, meter } = self;
            let _ = std::thread::spawn(move || {
                if let Err(e) = tracer.force_flush() {
                    eprintln!("note: OTLP spans: {e}");
                }
                let _ = tracer.shutdown();
                if let Err(e) = meter.force_flush() {
                    eprintln!("note: OTLP metrics: {e}");
                }
                let _ = meter.shutdown();
            })
            .join();
        }
    }
}
