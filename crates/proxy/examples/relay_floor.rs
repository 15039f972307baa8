use hscale::backend::BackendStream;
use tokio::net::TcpListener;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend)) = (args.next(), args.next()) else {
        std::process::exit(2);
    };
    let mode = std::env::var("MODE").unwrap_or_default();
    if mode == "tpc" {
        let n = 2;
        let std_listener = std::net::TcpListener::bind(&listen)?;
        let mut senders = Vec::new();
        for _ in 0..n {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<std::net::TcpStream>();
            senders.push(tx);
            let backend = backend.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    while let Some(s) = rx.recv().await {
                        s.set_nonblocking(true).unwrap();
                        let mut client = tokio::net::TcpStream::from_std(s).unwrap();
                        client.set_nodelay(true).unwrap();
                        let backend = backend.clone();
                        tokio::spawn(async move {
                            if let Ok(mut server) = BackendStream::connect(&backend).await {
                                let _ =
                                    tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            }
                        });
                    }
                });
            });
        }
        let mut i = 0;
        loop {
            let (s, _) = std_listener.accept()?;
            senders[i % n].send(s).unwrap();
            i += 1;
        }
    }
    if mode == "threads" {
        let std_listener = std::net::TcpListener::bind(&listen)?;
        let backend_path = backend.clone();
        loop {
            let (client, _) = std_listener.accept()?;
            client.set_nodelay(true)?;
            let server = std::os::unix::net::UnixStream::connect(&backend_path)?;
            let (mut c2, mut s2) = (client.try_clone()?, server.try_clone()?);
            let (mut c1, mut s1) = (client, server);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c1, &mut s1);
                let _ = s1.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Both);
            });
        }
    }
    let mut b = if mode == "ct" {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let rt = b.enable_all().build()?;
    rt.block_on(async move {
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
    })
}
