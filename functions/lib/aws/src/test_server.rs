//! A loopback HTTP/1.1 server for the AWS clients' unit tests.

use std::io::{Read, Write};
use std::time::Duration;

/// A loopback server answering `answers` connections, one request
/// each, in order; returns its URL and the requests it read.
pub fn serve(answers: Vec<String>) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for answer in answers {
            let (mut socket, _) = listener.accept().expect("accept");
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut buf = vec![0u8; 64 * 1024];
            let mut text = String::new();
            loop {
                let n = socket.read(&mut buf).expect("read");
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .and_then(|v| v.trim().parse::<usize>().ok())
                        })
                        .unwrap_or(0);
                    if text.len() >= end + 4 + length || n == 0 {
                        break;
                    }
                }
            }
            socket.write_all(answer.as_bytes()).expect("write");
            seen.push(text);
        }
        seen
    });
    (url, handle)
}

/// A complete HTTP/1.1 answer of `status` with a JSON-protocol `body`,
/// closing its connection.
pub fn answer(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/x-amz-json-1.0\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Static test credentials.
pub fn credentials() -> aws_credential_types::provider::SharedCredentialsProvider {
    aws_credential_types::provider::SharedCredentialsProvider::new(
        aws_credential_types::Credentials::new("AKIDEXAMPLE", "s", None, None, "t"),
    )
}
