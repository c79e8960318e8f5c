/* serve/assets.c: the dashboard's files, built into the binary so that `nas serve` and
 * `nas plot` need nothing installed beside it: serve/web/ (the page, its style and its
 * script) and Chart.js, taken from Debian's libjs-chart.js at build time (NAS_CHARTJS, set
 * by the Makefile, which also rebuilds this file when one of them changes).
 *
 * The assembler's .incbin copies each file's bytes into .rodata between two symbols, and a
 * NUL after each so it also reads as a C string. */
#include <string.h>

#include "serve/internal.h"

#ifndef NAS_CHARTJS
#error "NAS_CHARTJS (the path of Chart.js, chart.min.js) is set by the Makefile"
#endif

#define EMBED(sym, path)                                                                  \
  __asm__(".section .rodata\n"                                                            \
          ".global " #sym "\n.hidden " #sym "\n.balign 16\n" #sym ":\n"                   \
          ".incbin \"" path "\"\n"                                                        \
          ".global " #sym "_end\n.hidden " #sym "_end\n" #sym "_end:\n"                   \
          ".byte 0\n.previous\n");                                                        \
  extern const char sym[], sym##_end[]

EMBED(nas_web_index_html, "serve/web/index.html");
EMBED(nas_web_app_css, "serve/web/app.css");
EMBED(nas_web_app_js, "serve/web/app.js");
EMBED(nas_web_chart_js, NAS_CHARTJS);

bool serve_asset_find(const char *name, serve_asset *out) {
  static const struct {
    const char *name, *type, *start, *end;
  } files[] = {
      {"index.html", "text/html; charset=utf-8", nas_web_index_html, nas_web_index_html_end},
      {"app.css", "text/css; charset=utf-8", nas_web_app_css, nas_web_app_css_end},
      {"app.js", "text/javascript; charset=utf-8", nas_web_app_js, nas_web_app_js_end},
      {"chart.js", "text/javascript; charset=utf-8", nas_web_chart_js, nas_web_chart_js_end},
  };
  for (size_t i = 0; i < sizeof files / sizeof *files; i++)
    if (strcmp(files[i].name, name) == 0) {
      *out = (serve_asset){files[i].type, files[i].start, (size_t)(files[i].end - files[i].start)};
      return true;
    }
  return false;
}
