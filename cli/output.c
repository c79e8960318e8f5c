/* cli/output.c: rows printed as an aligned table for people, or as CSV or JSON for
 * programs. CSV and JSON keep full precision; the table rounds numbers to 6 digits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

int cli_parse_format(const char *text, out_format *out) {
  if (strcmp(text, "table") == 0) *out = FORMAT_TABLE;
  else if (strcmp(text, "csv") == 0) *out = FORMAT_CSV;
  else if (strcmp(text, "json") == 0) *out = FORMAT_JSON;
  else return NAS_ERR;
  return NAS_OK;
}

int cli_table_init(cli_table *t, const char *const *columns, size_t n) {
  memset(t, 0, sizeof *t);
  t->rows = json_array();
  if (!t->rows) return NAS_ERR;
  for (size_t i = 0; i < n; i++)
    if (cli_table_add_column(t, columns[i]) != NAS_OK) return NAS_ERR;
  return NAS_OK;
}

int cli_table_add_column(cli_table *t, const char *name) {
  char **bigger = realloc(t->columns, (t->n_columns + 1) * sizeof *bigger);
  if (!bigger) return NAS_ERR;
  t->columns = bigger;
  t->columns[t->n_columns] = strdup(name);
  return t->columns[t->n_columns++] ? NAS_OK : NAS_ERR;
}

int cli_table_add_row(cli_table *t, json_t *row) {
  return json_array_append_new(t->rows, row) == 0 ? NAS_OK : NAS_ERR;
}

void cli_table_free(cli_table *t) {
  for (size_t i = 0; i < t->n_columns; i++) free(t->columns[i]);
  free(t->columns);
  json_decref(t->rows);
  memset(t, 0, sizeof *t);
}

/* The code point of the UTF-8 character at c when a terminal acts on it rather than
 * showing it: a C1 control (U+0080-U+009F; U+009B is an 8-bit CSI) or a direction
 * override or isolate (U+202A-U+202E, U+2066-U+2069: what follows shows reversed, so a row
 * could show text it does not hold); else 0. *len gets its length in bytes. */
static unsigned acting_character(const unsigned char *c, size_t *len) {
  if (c[0] == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f) {
    *len = 2;
    return c[1];
  }
  bool override = c[0] == 0xe2 && ((c[1] == 0x80 && c[2] >= 0xaa && c[2] <= 0xae) ||
                                   (c[1] == 0x81 && c[2] >= 0xa6 && c[2] <= 0xa9));
  *len = 3;
  return override ? 0x2000u + ((c[1] & 0x3fu) << 6) + (c[2] & 0x3fu) : 0;
}

char *cli_text_shown(const char *text) {
  char *shown = malloc(4 * strlen(text) + 1), *at = shown;
  for (const unsigned char *c = (const unsigned char *)text; shown && *c; c++) {
    size_t len;
    unsigned acting = acting_character(c, &len);
    if (*c == '\n') at += sprintf(at, "\\n");
    else if (*c == '\t') at += sprintf(at, "\\t");
    else if (*c < 0x20 || *c == 0x7f) at += sprintf(at, "\\x%02x", *c);
    else if (acting) at += sprintf(at, "\\u%04x", acting), c += len - 1;
    else *at++ = (char)*c;
  }
  if (shown) *at = '\0';
  return shown;
}

/* A cell as text: exact for CSV; in a table (shown) 6 significant digits, and control
 * characters escaped (cli_text_shown). Owned. */
static char *cell_text(const json_t *cell, bool shown) {
  if (!cell || json_is_null(cell)) return strdup("");
  if (json_is_real(cell) && shown) return nas_asprintf("%.6g", json_real_value(cell));
  char *text = spec_value_text(cell);
  if (!shown || !text) return text;
  char *escaped = cli_text_shown(text);
  free(text);
  return escaped;
}

static void print_csv_field(const char *text) {
  if (!strpbrk(text, ",\"\n\r")) {
    fputs(text, stdout);
    return;
  }
  putchar('"');
  for (const char *p = text; *p; p++) {
    if (*p == '"') putchar('"');
    putchar(*p);
  }
  putchar('"');
}

static void print_csv(const cli_table *t) {
  for (size_t c = 0; c < t->n_columns; c++) {
    if (c) putchar(',');
    print_csv_field(t->columns[c]);
  }
  putchar('\n');
  size_t r;
  json_t *row;
  json_array_foreach(t->rows, r, row) {
    for (size_t c = 0; c < t->n_columns; c++) {
      char *text = cell_text(json_array_get(row, c), false);
      if (c) putchar(',');
      print_csv_field(text ? text : "");
      free(text);
    }
    putchar('\n');
  }
}

static void print_json(const cli_table *t) {
  json_t *out = json_array();
  size_t r;
  json_t *row;
  json_array_foreach(t->rows, r, row) {
    json_t *obj = json_object();
    for (size_t c = 0; c < t->n_columns; c++) {
      json_t *cell = json_array_get(row, c);
      json_object_set(obj, t->columns[c], cell ? cell : json_null());
    }
    json_array_append_new(out, obj);
  }
  cli_print_json(out);
  json_decref(out);
}

void cli_print_json(const json_t *value) {
  json_dumpf(value, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
  putchar('\n');
}

void cli_format_time(double unix_s, char *buf, size_t cap) {
  time_t when = (time_t)unix_s;
  struct tm tm;
  gmtime_r(&when, &tm);
  strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void print_aligned(const cli_table *t) {
  size_t n_rows = json_array_size(t->rows), nc = t->n_columns;
  char **cells = calloc((n_rows + 1) * (nc ? nc : 1), sizeof *cells);
  size_t *width = calloc(nc ? nc : 1, sizeof *width);
  if (!cells || !width) {
    free(cells), free(width);
    return;
  }
  for (size_t c = 0; c < nc; c++) cells[c] = cli_text_shown(t->columns[c]);
  for (size_t r = 0; r < n_rows; r++)
    for (size_t c = 0; c < nc; c++)
      cells[(r + 1) * nc + c] = cell_text(json_array_get(json_array_get(t->rows, r), c), true);
  for (size_t i = 0; i < (n_rows + 1) * nc; i++) {
    size_t len = cells[i] ? strlen(cells[i]) : 0;
    if (len > width[i % nc]) width[i % nc] = len;
  }
  for (size_t r = 0; r <= n_rows; r++) {
    for (size_t c = 0; c < nc; c++)
      printf("%s%-*s", c ? "  " : "", c + 1 < nc ? (int)width[c] : 0,
             cells[r * nc + c] ? cells[r * nc + c] : "");
    putchar('\n');
  }
  for (size_t i = 0; i < (n_rows + 1) * nc; i++) free(cells[i]);
  free(cells), free(width);
}

void cli_table_print(const cli_table *t, out_format format) {
  switch (format) {
  case FORMAT_CSV: print_csv(t); break;
  case FORMAT_JSON: print_json(t); break;
  case FORMAT_TABLE: print_aligned(t); break;
  }
  fflush(stdout);
}
