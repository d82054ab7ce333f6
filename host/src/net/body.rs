//! Reading an HTTP response body within a bound — a downstream's answer, a
//! registry's manifest or blob, an identity provider's keys: a peer that
//! announces or sends more than the bound is cut off there, never buffered
//! whole. One reader, so every caller refuses the same way.

/// Why a body was not read whole.
#[derive(Debug)]
pub enum BodyError {
    /// It is, or announces that it is, larger than the bound.
    TooLarge,
    /// The connection failed while it was read.
    Transport(reqwest::Error),
    /// The sink refused a chunk (a local write).
    Sink(std::io::Error),
}

/// Feeds `response`'s body to `sink` chunk by chunk, refusing it once it
/// is, or announces that it is, more than `max` bytes; the bytes read.
///
/// # Errors
/// [`BodyError`]: too large, the transport, or the sink.
pub async fn read_within(mut response: reqwest::Response, max: u64, mut sink: impl FnMut(&[u8]) -> std::io::Result<()>) -> Result<u64, BodyError> {
    if response.content_length().is_some_and(|n| n > max) {
        return Err(BodyError::TooLarge);
    }
    let mut read = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        read += chunk.len() as u64;
        if read > max {
            return Err(BodyError::TooLarge);
        }
        sink(&chunk).map_err(BodyError::Sink)?;
    }
    Ok(read)
}

/// `response`'s whole body, if it is at most `max` bytes.
///
/// # Errors
/// [`BodyError`]: too large, or the transport.
pub async fn collect_within(response: reqwest::Response, max: u64) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    read_within(response, max, |chunk| {
        body.extend_from_slice(chunk);
        Ok(())
    })
    .await?;
    Ok(body)
}
