// --listen/--advertise and the older --host/--port (libps/net/endpoint).
#include <doctest/doctest.h>

#include "libps/net/endpoint.hpp"
#include "libps/keys/keys.hpp"

using ps::resolve_endpoint;

TEST_CASE("endpoint: by default every interface, any port, the advertised host left to the route") {
  auto e = resolve_endpoint({});
  CHECK(e.bind_host == "0.0.0.0");
  CHECK(e.every_interface());
  CHECK(e.bind_port == 0);
  CHECK(e.advertise_host.empty());
  CHECK(e.advertise_port == 0);
}

TEST_CASE("endpoint: --host is both the bind and the advertised host; --port the port") {
  auto e = resolve_endpoint({"10.0.0.5", 7000, "", ""});
  CHECK(e.bind_host == "10.0.0.5");
  CHECK(e.advertise_host == "10.0.0.5");
  CHECK(e.bind_port == 7000);
}

TEST_CASE("endpoint: --listen and --advertise win over --host and --port") {
  auto e = resolve_endpoint({"10.0.0.5", 7000, "10.0.0.6:7001", ""});
  CHECK(e.bind_host == "10.0.0.6");
  CHECK(e.advertise_host == "10.0.0.6");  // a specific listen address is what others dial
  CHECK(e.bind_port == 7001);
  e = resolve_endpoint({"10.0.0.5", 7000, ":7002", "gateway.example:9000"});
  CHECK(e.every_interface());
  CHECK(e.bind_port == 7002);
  CHECK(e.advertise_host == "gateway.example");
  CHECK(e.advertise_port == 9000);
  // Every interface keeps --host's advertised host.
  e = resolve_endpoint({"10.0.0.5", 0, "*:7003", ""});
  CHECK(e.every_interface());
  CHECK(e.advertise_host == "10.0.0.5");
}

TEST_CASE("endpoint: bad values are refused naming the flag") {
  CHECK_THROWS_WITH_AS(resolve_endpoint({"", 0, "7000", ""}), doctest::Contains("--listen=7000 is not ADDR:PORT"),
                       ps::bad_request);
  CHECK_THROWS_WITH_AS(resolve_endpoint({"", 0, "h:70000", ""}), doctest::Contains("--listen=h:70000: port \"70000\""),
                       ps::bad_request);
  CHECK_THROWS_WITH_AS(resolve_endpoint({"", 0, "", "0.0.0.0"}), doctest::Contains("--advertise=0.0.0.0"),
                       ps::bad_request);
  CHECK_THROWS_WITH_AS(resolve_endpoint({"", 0, "", "h:0"}), doctest::Contains("--advertise=h:0: port"),
                       ps::bad_request);
  CHECK_THROWS_WITH_AS(resolve_endpoint({"a b", 0, "", ""}), doctest::Contains("--host=a b"), ps::bad_request);
  CHECK_THROWS_WITH_AS(ps::parse_host_port("h:x"), doctest::Contains("port \"x\""), ps::bad_request);
}
