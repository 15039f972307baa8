//! Whatever a client sends during login or COM_CHANGE_USER, and whatever a
//! backend greets with, parsing fails cleanly or succeeds; it never panics.
#![no_main]

use hscale_wire::packets::{
    parse_auth_switch, ChangeUser, ClientHello, ErrorPacket, OkInfo, ServerGreeting,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|payload: &[u8]| {
    let _ = ClientHello::parse(payload);
    let _ = ClientHello::is_ssl_request(payload);
    let _ = ChangeUser::parse(payload);
    let _ = ServerGreeting::parse(payload);
    let _ = ErrorPacket::parse(payload);
    let _ = OkInfo::parse(payload);
    let _ = parse_auth_switch(payload);
});
