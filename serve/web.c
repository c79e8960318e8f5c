/* serve/web.c: the dashboard's side of nas serve and nas plot.
 *
 * Served: GET / is the dashboard's page and /static/NAME its files (assets.c); the page's
 * script then reads the JSON API (docs/dashboard.md). Written: serve_plot_write gives the
 * same page as one file with its style, Chart.js, its script and the data inlined, so that
 * it opens from disk. The script draws from fetched or from inlined data alike: one
 * rendering path for both. */
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

bool serve_web_route(serve_request *req) {
  if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0) return false;
  const char *name = NULL;
  if (strcmp(req->path, "/") == 0 || strcmp(req->path, "/index.html") == 0) name = "index.html";
  else if (strncmp(req->path, "/static/", 8) == 0) name = req->path + 8;
  if (!name || !serve_asset_find(name, &req->asset)) return false;
  req->status = MHD_HTTP_OK;
  return true;
}

/* ---- nas plot ------------------------------------------------------------------------------ */

/* The page's lines that name its files, each replaced by the file itself in a plot. */
static const struct {
  const char *line, *asset, *open, *close;
} inlined[] = {
    {"<link rel=\"stylesheet\" href=\"static/app.css\">", "app.css", "<style>", "</style>"},
    {"<script src=\"static/chart.js\"></script>", "chart.js", "<script>", "</script>"},
    {"<script src=\"static/app.js\"></script>", "app.js", "<script>", "</script>"},
};

/* Writes asset name between open and close; refuses one that would end its element early. */
static int write_inlined(FILE *f, const char *name, const char *open, const char *close,
                         nas_err *err) {
  serve_asset a;
  if (!serve_asset_find(name, &a)) return nas_errf(err, "no built-in file %s", name);
  if (strstr(a.bytes, close)) return nas_errf(err, "built-in file %s holds '%s'", name, close);
  fprintf(f, "%s\n", open);
  fwrite(a.bytes, 1, a.size, f);
  fprintf(f, "\n%s\n", close);
  return NAS_OK;
}

/* window.NAS_DATA = JSON.parse("data"): parsed as JSON, as the served page does, not as a
 * script's object literal, where a key "__proto__" (a metric may be named so) would set the
 * object's prototype instead of being a key. Every '<' is written as \u003c, so nothing in
 * the data can close the script or open a comment. */
static int write_data(FILE *f, const json_t *data, nas_err *err) {
  char *text = json_dumps(data, JSON_COMPACT);
  json_t *as_string = text ? json_string(text) : NULL;
  char *literal = as_string ? json_dumps(as_string, JSON_ENCODE_ANY) : NULL;
  free(text);
  json_decref(as_string);
  if (!literal) return nas_errf(err, "out of memory");
  fputs("<script>window.NAS_DATA = JSON.parse(", f);
  for (const char *c = literal; *c; c++) {
    if (*c == '<') fputs("\\u003c", f);
    else fputc(*c, f);
  }
  fputs(");</script>\n", f);
  free(literal);
  return NAS_OK;
}

int serve_plot_write(FILE *f, const json_t *data, nas_err *err) {
  serve_asset page;
  if (!serve_asset_find("index.html", &page)) return nas_errf(err, "no built-in page");
  int rc = NAS_OK;
  for (const char *line = page.bytes; rc == NAS_OK && *line;) {
    const char *eol = strchr(line, '\n');
    size_t len = eol ? (size_t)(eol - line) : strlen(line);
    const char *trimmed = line;
    while (trimmed < line + len && (*trimmed == ' ' || *trimmed == '\t')) trimmed++;
    size_t k = 0, n = sizeof inlined / sizeof *inlined;
    while (k < n && !(strlen(inlined[k].line) == (size_t)(line + len - trimmed) &&
                      strncmp(trimmed, inlined[k].line, strlen(inlined[k].line)) == 0))
      k++;
    if (k < n && strcmp(inlined[k].asset, "app.js") == 0) rc = write_data(f, data, err);
    if (rc == NAS_OK && k < n) rc = write_inlined(f, inlined[k].asset, inlined[k].open, inlined[k].close, err);
    else if (rc == NAS_OK) fprintf(f, "%.*s\n", (int)len, line);
    line += eol ? len + 1 : len;
  }
  if (rc == NAS_OK && ferror(f)) rc = nas_errf(err, "cannot write the page");
  return rc;
}
