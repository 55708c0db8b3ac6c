//! A test MCP server on the official Rust SDK (rmcp), with the tools of the Go test servers
//! (tests/peers/go/tools/tools.go): the same results, byte for byte in value. Over stdio, or streamable HTTP
//! at http://HOST:PORT/mcp with `--http HOST:PORT` (rmcp's own service, with its default configuration).

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

// The constants of tests/peers/go/tools/tools.go.
const DEFAULT_LINES: u64 = 600;
const HEADING: &str = "# Field report <draft> & notes, café №7";
const WEATHER_JSON: &str = r#"{"city":"Paris","conditions":["sunny","windy"],"humidity":40,"temperature":21.5}"#;
const FAIL_TEXT: &str = "quota exceeded for <tenant> & retry later";
const IMAGE_PNG: &str = include_str!("image.b64");
const DOCUMENT_INPUT: &str = r#"{"type":"object","properties":{"lines":{"type":"integer","minimum":1,"maximum":5000,"default":600,"description":"how many lines to read"}}}"#;
const EMPTY_INPUT: &str = r#"{"type":"object","properties":{}}"#;
const WEATHER_OUTPUT: &str = r#"{"type":"object","properties":{"city":{"type":"string"},"conditions":{"type":"array","items":{"type":"string"},"maxItems":8},"humidity":{"type":"integer"},"temperature":{"type":"number"}},"required":["city","conditions","humidity","temperature"]}"#;
const WORDS: [&str; 11] = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"];

fn line(i: u64) -> String {
    let mut out = format!("{i:05}");
    for k in 0..8u64 {
        out.push_str(&format!(" {}{}", WORDS[((i * 7 + k * 3) % 11) as usize], (i * k) % 97));
    }
    out
}

fn document(lines: u64) -> String {
    std::iter::once(HEADING.to_string()).chain((0..lines).map(line)).collect::<Vec<_>>().join("\n")
}

fn schema(text: &str) -> Arc<JsonObject> {
    Arc::new(serde_json::from_str(text).expect("a schema constant is a JSON object"))
}

/// A result with isError only when true, as the Go SDKs write it (rmcp's constructors write isError false).
fn result(content: Vec<ContentBlock>, structured: Option<serde_json::Value>, error: bool) -> CallToolResponse {
    let mut out = if error { CallToolResult::error(content) } else { CallToolResult::success(content) };
    out.structured_content = structured;
    out.is_error = error.then_some(true);
    CallToolResponse::Complete(out)
}

struct Peer;

impl ServerHandler for Peer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("rmcp-peer", "1.0.0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut weather = Tool::new("weather", "Today's weather in Paris.", schema(EMPTY_INPUT));
        weather.output_schema = Some(schema(WEATHER_OUTPUT));
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("read_document", "A long field report, line by line.", schema(DOCUMENT_INPUT)),
            weather,
            Tool::new("fail", "Always fails.", schema(EMPTY_INPUT)),
            Tool::new("image", "A small PNG.", schema(EMPTY_INPUT)),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match request.name.as_ref() {
            "read_document" => {
                let lines = request.arguments.as_ref().and_then(|a| a.get("lines")).and_then(|v| v.as_u64());
                Ok(result(vec![ContentBlock::text(document(lines.unwrap_or(DEFAULT_LINES)))], None, false))
            }
            "weather" => {
                let value = serde_json::from_str(WEATHER_JSON).expect("WEATHER_JSON is JSON");
                Ok(result(vec![ContentBlock::text(WEATHER_JSON)], Some(value), false))
            }
            "fail" => Ok(result(vec![ContentBlock::text(FAIL_TEXT)], None, true)),
            "image" => Ok(result(vec![ContentBlock::image(IMAGE_PNG.trim(), "image/png")], None, false)),
            other => Err(ErrorData::invalid_params(format!("unknown tool {other:?}"), None)),
        }
    }
}

/// Serves streamable HTTP at /mcp (anything else: 404, as the Go servers' mux does), one task per connection.
async fn serve_http(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    use http_body_util::{BodyExt, Empty};

    let service = StreamableHttpService::new(
        || Ok(Peer),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let service = service.clone();
        let handler = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let service = service.clone();
            async move {
                if request.uri().path() == "/mcp" {
                    return Ok::<_, std::convert::Infallible>(service.handle(request).await);
                }
                let mut response = hyper::Response::new(Empty::new().map_err(|never| match never {}).boxed());
                *response.status_mut() = hyper::StatusCode::NOT_FOUND;
                Ok(response)
            }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            // A connection's error (the client went away) ends that connection only.
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, handler).await;
        });
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            let service = Peer.serve(rmcp::transport::stdio()).await?;
            service.waiting().await?;
            Ok(())
        }
        [flag, addr] if flag == "--http" => serve_http(addr).await,
        _ => Err("usage: rmcp-peer [--http HOST:PORT]".into()),
    }
}
