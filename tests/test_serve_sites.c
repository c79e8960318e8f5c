/* Unit tests of how `nas serve` tells a request from a page of another site (serve/parse.c):
 * which Host headers name loopback, and which Origin headers are the server itself. The
 * end-to-end refusals are in test_serve.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "serve/internal.h"

static void loopback_hosts_are_loopback_addresses_and_localhost_with_any_port(void **state) {
  (void)state;
  static const char *const loopback[] = {"127.0.0.1:8470", "127.0.0.1", "127.5.6.7:1",
                                         "localhost:8470", "LocalHost", "[::1]:8470", "[::1]",
                                         "[::ffff:127.0.0.1]:80"};
  static const char *const elsewhere[] = {"evil.example:8470", "localhost.evil.example",
                                          "127.0.0.1.evil.example:8470", "128.0.0.1:8470",
                                          "10.0.0.1", "[::2]:8470", "[::1", "[::1]x", ":8470",
                                          "", "0.0.0.0:8470"};
  for (size_t i = 0; i < sizeof loopback / sizeof *loopback; i++)
    if (!serve_host_is_loopback(loopback[i])) fail_msg("'%s' is loopback", loopback[i]);
  for (size_t i = 0; i < sizeof elsewhere / sizeof *elsewhere; i++)
    if (serve_host_is_loopback(elsewhere[i])) fail_msg("'%s' is not loopback", elsewhere[i]);
}

static void an_origin_is_the_server_only_when_it_is_the_host_after_a_scheme(void **state) {
  (void)state;
  assert_true(serve_origin_is_host("http://127.0.0.1:8470", "127.0.0.1:8470"));
  assert_true(serve_origin_is_host("https://nas.lab:443", "NAS.lab:443"));
  assert_false(serve_origin_is_host("http://127.0.0.1:8471", "127.0.0.1:8470"));
  assert_false(serve_origin_is_host("http://evil.example", "127.0.0.1:8470"));
  assert_false(serve_origin_is_host("null", "127.0.0.1:8470"));
  assert_false(serve_origin_is_host("127.0.0.1:8470", "127.0.0.1:8470"));
  assert_false(serve_origin_is_host("http://127.0.0.1:8470", NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(loopback_hosts_are_loopback_addresses_and_localhost_with_any_port),
      cmocka_unit_test(an_origin_is_the_server_only_when_it_is_the_host_after_a_scheme),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
