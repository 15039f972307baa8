//! The cost floor of any proxy on this machine: a byte relay that understands
//! nothing, one task per client, one backend connection per client. The
//! benchmark runs it beside hscale so that hscale's CPU per query can be read
//! against what the kernel alone charges for the extra hop.
//!
//!     cargo run --release --example relay_floor -- LISTEN_ADDR BACKEND_ADDR_OR_SOCKET

use hscale::backend::BackendStream;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend)) = (args.next(), args.next()) else {
        eprintln!("usage: relay_floor LISTEN_ADDR BACKEND_ADDR_OR_SOCKET");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen).await?;
    loop {
        let (mut client, _) = listener.accept().await?;
        client.set_nodelay(true)?;
        let backend = backend.clone();
        tokio::spawn(async move {
            if let Ok(mut server) = BackendStream::connect(&backend).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            }
        });
    }
}
