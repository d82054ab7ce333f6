//! A minimal MCP client over Streamable HTTP: the 2025-11-25 handshake, then
//! JSON-RPC requests in its session. The benchmarks drive the server with it,
//! and so do the integration tests (one client for both).

/// An initialised MCP session with a server's `/mcp` endpoint.
pub struct McpClient {
    http: reqwest::Client,
    url: String,
    session: String,
}

impl McpClient {
    /// Initialises a session with the server at `url` (its `/mcp` endpoint).
    ///
    /// # Errors
    /// The server could not be reached or refused the handshake.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::new();
        let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"toolguard-client","version":"1"}}}"#;
        let response = Self::post(&http, url, None, init.to_string()).await?;
        let session = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        response.bytes().await?;
        let client = Self { http, url: url.into(), session };
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string();
        Self::post(&client.http, &client.url, Some(&client.session), initialized).await?.bytes().await?;
        Ok(client)
    }

    async fn post(http: &reqwest::Client, url: &str, session: Option<&str>, body: String) -> anyhow::Result<reqwest::Response> {
        let mut req = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body);
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        Ok(req.send().await?.error_for_status()?)
    }

    /// Posts a JSON-RPC message in the session; the server's response.
    ///
    /// # Errors
    /// The request failed or the server answered with an error status.
    pub async fn send(&self, body: String) -> anyhow::Result<reqwest::Response> {
        Self::post(&self.http, &self.url, Some(&self.session), body).await
    }

    /// Sends JSON-RPC request `method` with `params` as request `id`; the
    /// whole JSON-RPC response (read from a JSON body or its event stream).
    ///
    /// # Errors
    /// The request failed, or its response is not JSON-RPC.
    pub async fn request(&self, id: u64, method: &str, params: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let body = serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let text = self.send(body.to_string()).await?.text().await?;
        let event = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| !d.is_empty());
        serde_json::from_str(event.unwrap_or(&text).trim()).map_err(|e| anyhow::anyhow!("not a JSON-RPC response ({e}): {text}"))
    }
}
