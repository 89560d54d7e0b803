//! A validating admission webhook of the test's own: HTTPS on a loopback port with a
//! certificate from a CA made with rcgen, answering each review with what the test says and
//! keeping the reviews it got. What the emulator calls where a real cluster calls a
//! controller's webhook.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_json::{Value, json};

type Answer = dyn Fn(&Value) -> Value + Send + Sync;

/// A webhook over HTTPS on a loopback port, with a certificate for `dns` from a CA of its own.
pub struct Hook {
    pub port: u16,
    ca_pem: String,
    reviews: Arc<Mutex<Vec<Value>>>,
}

impl Hook {
    /// Serves on a free port with a certificate for `dns`, answering each review with
    /// `answer(review)`.
    pub fn start(dns: &str, answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Hook {
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("a CA");
        let key = rcgen::KeyPair::generate().expect("a serving key");
        let cert = rcgen::CertificateParams::new(vec![dns.to_owned()])
            .expect("serving parameters")
            .signed_by(&key, &ca)
            .expect("a serving certificate");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .expect("a TLS configuration");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = listener.local_addr().expect("its address").port();
        let reviews = Arc::new(Mutex::new(Vec::new()));
        let answer: Arc<Answer> = Arc::new(answer);
        let seen = reviews.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, answer, seen) = (config.clone(), answer.clone(), seen.clone());
                std::thread::spawn(move || {
                    // A client that gives up (a timeout) is not the test's failure.
                    let _ = serve_one(tcp, config, &*answer, &seen);
                });
            }
        });
        Hook {
            port,
            ca_pem: ca.pem(),
            reviews,
        }
    }

    /// The CA, as a webhook configuration's `caBundle`.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }

    /// Every review received, oldest first.
    pub fn reviews(&self) -> Vec<Value> {
        self.reviews.lock().expect("reviews").clone()
    }

    /// The last review's `request`.
    pub fn last(&self) -> Value {
        self.reviews().last().expect("a review")["request"].clone()
    }
}

/// One HTTP/1.1 exchange over TLS: the review in, the answer out.
fn serve_one(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    answer: &Answer,
    seen: &Mutex<Vec<Value>>,
) -> std::io::Result<()> {
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = BufReader::new(rustls::StreamOwned::new(conn, tcp));
    let mut length = 0;
    loop {
        let mut line = String::new();
        tls.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    tls.read_exact(&mut body)?;
    let review: Value = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    seen.lock().expect("reviews").push(review.clone());
    let out = answer(&review).to_string();
    let tls = tls.get_mut();
    write!(
        tls,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
        out.len()
    )?;
    tls.flush()?;
    tls.conn.send_close_notify();
    tls.flush()
}

/// An answer to `review` allowing it or not, with `extra` fields in the response.
pub fn response(review: &Value, allowed: bool, extra: Value) -> Value {
    let mut r = json!({"uid": review["request"]["uid"], "allowed": allowed});
    for (k, v) in extra.as_object().into_iter().flatten() {
        r[k] = v.clone();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": r})
}
