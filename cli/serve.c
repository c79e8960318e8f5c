/* cli/serve.c: `nas serve`, the HTTP service (serve/serve.h, docs/api.md). */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "serve/serve.h"

static const char serve_help[] =
    "usage: nas serve [--storage URL] [--listen HOST:PORT] [--token-file FILE]\n"
    "                 [--tls-cert FILE --tls-key FILE] [--threads N]\n\n"
    "Serves every experiment of one storage over HTTP: a JSON API under /api/v1/ to list\n"
    "and read experiments, trials and Pareto fronts, create and stop experiments, and drive\n"
    "trials from your own code with ask and tell (docs/api.md); and a dashboard for\n"
    "browsers at / (docs/dashboard.md). Runs in the foreground,\n"
    "logs one line per request, and stops on Ctrl-C or SIGTERM. It can run beside\n"
    "'nas run' on the same storage.\n\n"
    "  --storage URL      default: $NAS_STORAGE, else sqlite:nas.db\n"
    "  --listen HOST:PORT where to listen (default 127.0.0.1:8470; port 0 picks a free one)\n"
    "  --token-file FILE  lines 'read TOKEN' or 'write TOKEN'; requests then need\n"
    "                     'Authorization: Bearer TOKEN'. Without it only clients on this\n"
    "                     machine (loopback) are served. The file must be private (chmod 600).\n"
    "  --tls-cert FILE, --tls-key FILE  serve HTTPS with this PEM certificate and key;\n"
    "                     without them tokens cross the network in clear text (a warning\n"
    "                     says so when the server listens beyond loopback)\n"
    "  --threads N        requests served at once, 1 to 64, each on a storage connection of\n"
    "                     its own (default: 4 on SQLite, whose writes the server groups;\n"
    "                     16 on PostgreSQL, whose commits run side by side)\n";

typedef struct {
  const char *url;
  bool without_tokens; /* no --token-file */
} listening_ctx;

/* Said once the server listens, not before: options or a storage that turn out unusable
 * end it first, and it never served anyone. */
static void say_listening(void *ctx, int port) {
  const listening_ctx *l = ctx;
  if (l->without_tokens)
    fprintf(stderr, "nas serve: no --token-file: serving clients on this machine (loopback) "
                    "only, without tokens\n");
  char *shown = storage_url_redacted(l->url);
  fprintf(stderr, "nas serve: listening on port %d (storage %s)\n", port, shown ? shown : "?");
  fflush(stderr);
  free(shown);
}

static int take_serve_option(const char *cmd, int c, char *arg, void *ctx) {
  serve_options *opt = ctx;
  long threads;
  switch (c) {
  case 'l': opt->listen = arg; break;
  case 't': opt->token_file = arg; break;
  case 'c': opt->tls_cert = arg; break;
  case 'k': opt->tls_key = arg; break;
  default: /* --threads */
    if (!cli_parse_count(arg, 1, SERVE_THREADS_MOST, &threads))
      return cli_usage_error(cmd, "--threads wants a count from 1 to %d, not '%s'",
                             SERVE_THREADS_MOST, arg);
    opt->threads = (unsigned)threads;
  }
  return -1;
}

int cmd_serve(int argc, char **argv) {
  static const struct option options[] = {{"listen", required_argument, NULL, 'l'},
                                          {"token-file", required_argument, NULL, 't'},
                                          {"tls-cert", required_argument, NULL, 'c'},
                                          {"tls-key", required_argument, NULL, 'k'},
                                          {"threads", required_argument, NULL, 'n'},
                                          {NULL, 0, NULL, 0}};
  serve_options opt = {.listen = "127.0.0.1:8470", .log = stderr};
  const cli_command cmd = {"serve", serve_help, options, NULL, take_serve_option, &opt};
  char *storage_flag; /* owned (cli_storage_flag) */
  int status = cli_parse_options(&cmd, argc, argv, &storage_flag);
  if (status < 0 && optind != argc)
    status = cli_usage_error("serve", "unexpected argument '%s'", argv[optind]);
  if (status >= 0) {
    free(storage_flag);
    return status;
  }
  opt.storage_url = cli_storage_url(storage_flag);
  listening_ctx l = {opt.storage_url, !opt.token_file};
  opt.on_listening = say_listening;
  opt.on_listening_ctx = &l;
  /* Asks run the GP on the request threads: OpenBLAS's own threads would only compete
   * with them for the cores (as in `nas run`, cli/run.c). */
  openblas_set_num_threads(1);
  nas_err err;
  status = serve_run(&opt, &err) == NAS_OK ? EXIT_DONE : cli_fail(&err);
  if (status == EXIT_DONE) fprintf(stderr, "nas serve: stopped\n");
  free(storage_flag);
  return status;
}
