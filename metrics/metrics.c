/* metrics/metrics.c: the stdout line protocol a trial reports metrics with
 * (`nas-metric {"accuracy": 0.93, "step": 3}`; docs/metrics-protocol.md).
 *
 * Invariants:
 * - A line adds all of its observations or none of them.
 * - Reading a log holds at most one block and METRIC_LINE_MAX bytes of one line in
 *   memory, whatever the log holds (binary output, lines of gigabytes).
 * - The offset only ever moves to the end of a complete line (or of the file, for a log
 *   read to its end), and only when the whole call succeeds; on failure the set, the
 *   offset and the counters are as they were. It moves back (to 0) only when the file is
 *   shorter than the offset, i.e. the trial truncated its log.
 * - One read takes a bounded share of a log (METRIC_REPORT_MAX): what it returns with its
 *   offset is one storage report of bounded size, so a backlog of any size is stored in
 *   several reports, each with the offset of its own last line, and none counted twice.
 * - The log is the trial's: whatever it put in its place is opened without waiting and
 *   refused unless it is a regular file.
 */
#include "metrics/metrics.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define METRIC_LINE_MAX (64 * 1024) /* longer metric lines are malformed, never buffered */
#define READ_BLOCK (64 * 1024)
#define STEP_MAX 9007199254740992.0 /* 2^53: from it on a real no longer holds every integer */
/* One read's bound: it stops after the line that brings it to METRIC_REPORT_MAX
 * observations or to METRIC_REPORT_NAME_BYTES bytes of metric lines (a name's bytes are
 * those of its line), so that what it read is one storage report. A line is never split,
 * so a read may pass these by one line (at most METRIC_LINE_MAX bytes). */

bool metric_report_full(size_t n, size_t text_bytes) {
  return n >= METRIC_REPORT_MAX || text_bytes >= METRIC_REPORT_NAME_BYTES;
}

/* ---- metric sets ---- */

int metric_set_add(metric_set *set, const char *name, int64_t step, double value,
                   double time, nas_err *err) {
  if (set->n == set->cap) {
    size_t cap = set->cap ? set->cap * 2 : 16;
    metric_obs *grown = realloc(set->obs, cap * sizeof *grown);
    if (!grown) return nas_errf(err, "metric %s: out of memory", name);
    set->obs = grown;
    set->cap = cap;
  }
  char *name_copy = strdup(name);
  if (!name_copy) return nas_errf(err, "metric %s: out of memory", name);
  set->obs[set->n++] = (metric_obs){.name = name_copy, .step = step, .value = value, .time = time};
  return NAS_OK;
}

/* Drops the observations past the first n. */
static void set_truncate(metric_set *set, size_t n) {
  while (set->n > n) free((char *)set->obs[--set->n].name);
}

void metric_set_free(metric_set *set) {
  set_truncate(set, 0);
  free(set->obs);
  *set = (metric_set){0};
}

/* ---- one line ---- */

/* Where the JSON of a metric line starts, or NULL when line is not a metric line: blanks,
 * "nas-metric", then a blank or the end of the line. */
static const char *metric_json_start(const char *line, size_t len) {
  size_t prefix_len = strlen(METRIC_LINE_PREFIX) - 1; /* without its space */
  size_t i = 0;
  while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
  if (len - i < prefix_len || memcmp(line + i, METRIC_LINE_PREFIX, prefix_len) != 0) return NULL;
  i += prefix_len;
  if (i < len && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') return NULL;
  return line + i;
}

/* Length of a non-finite number at p as Python ("NaN", "-Infinity") or printf ("nan",
 * "-inf") write them; 0 when there is none. */
static size_t nonfinite_len(const char *p) {
  static const char *const words[] = {"infinity", "inf", "nan"};
  size_t sign = *p == '-' || *p == '+';
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
    size_t len = strlen(words[i]);
    if (strncasecmp(p + sign, words[i], len) == 0 && !isalnum((unsigned char)p[sign + len]))
      return sign + len;
  }
  return 0;
}

/* Whether a word at p stands where a value goes: after ':', '[' or ',' (prev, the last
 * byte before it that is neither blank nor inside a string) and not before a ':' (after a
 * ',' a key can stand too: `{"a": 1, nan: 2}`). */
static bool in_value_position(char prev, const char *after_word) {
  if (prev != ':' && prev != '[' && prev != ',') return false;
  after_word += strspn(after_word, " \t\r\n");
  return *after_word != ':';
}

/* Owned copy of json with every bare non-finite number in value position put in quotes,
 * so that the parse succeeds and the check can name the metric that holds it. Outside
 * strings JSON has no other word these could be part of; one in key position is left
 * bare, for the parse to refuse (`{nan: 1}` is no metric named "nan"). */
static char *nonfinite_quoted(const char *json) {
  size_t len = strlen(json);
  char *out = malloc(len * 2 + 1); /* each word of >= 3 bytes gains 2 */
  if (!out) return NULL;
  bool in_string = false;
  char prev = '\0';
  size_t k = 0;
  for (const char *p = json; *p;) {
    size_t word = in_string ? 0 : nonfinite_len(p);
    if (word && in_value_position(prev, p + word)) {
      out[k++] = '"';
      memcpy(out + k, p, word);
      k += word;
      out[k++] = '"';
      p += word;
      prev = '"';
      continue;
    }
    if (!in_string && !strchr(" \t\r\n", *p)) prev = *p;
    if (*p == '"') in_string = !in_string;
    if (in_string && *p == '\\' && p[1]) out[k++] = *p++; /* an escaped quote stays inside */
    out[k++] = *p++;
  }
  out[k] = '\0';
  return out;
}

static const char *json_kind(const json_t *value) {
  switch (json_typeof(value)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  default: return "a number";
  }
}

int metric_step_check(double step, nas_err *err) {
  if (!(step >= 0) || step >= STEP_MAX || step != floor(step))
    return nas_errf(err, "\"step\" must be a whole number from 0 to 2^53 - 1 "
                         "(9007199254740991)");
  return NAS_OK;
}

/* Numbers are parsed as reals (line_check): one below 2^53 that is whole is the integer
 * printed, exactly; a larger one may have been rounded to it, so it is refused. */
static int step_read(const json_t *value, int64_t *step, nas_err *err) {
  double real = json_is_number(value) ? json_number_value(value) : NAN; /* NaN: refused */
  if (metric_step_check(real, err) != NAS_OK) return NAS_ERR;
  *step = (int64_t)real;
  return NAS_OK;
}

int metric_check(const char *name, double value, nas_err *err) {
  if (!name[0]) return nas_errf(err, "a metric has an empty name");
  if (!nas_is_utf8(name)) return nas_errf(err, "a metric's name is not valid UTF-8");
  if (!isfinite(value))
    return nas_errf(err, "metric \"%s\" is %g, not a finite number", name, value);
  size_t len = strlen(name), suffix = strlen(METRIC_SEM_SUFFIX);
  if (len > suffix && strcmp(name + len - suffix, METRIC_SEM_SUFFIX) == 0 && value < 0)
    return nas_errf(err, "metric \"%s\" is a standard error, so it must be >= 0, not %g", name,
                    value);
  return NAS_OK;
}

/* Refuses text when it is a word for a value that is not finite ("nan", "-Infinity"), as
 * a metric line or an argument may hold one: named by the metric, not refused as no number. */
static int nonfinite_word_check(const char *name, const char *text, nas_err *err) {
  if (text[0] && nonfinite_len(text) == strlen(text))
    return nas_errf(err, "metric \"%s\" is %s, not a finite number", name, text);
  return NAS_OK;
}

static int value_check(const char *name, const json_t *value, nas_err *err) {
  if (!name[0]) return nas_errf(err, "a metric has an empty name");
  const char *text = json_is_string(value) ? json_string_value(value) : "";
  if (nonfinite_word_check(name, text, err) != NAS_OK) return NAS_ERR;
  if (!json_is_number(value))
    return nas_errf(err, "metric \"%s\" is %s, not a number", name, json_kind(value));
  return metric_check(name, json_number_value(value), err);
}

#define DIGITS "0123456789"

/* Length of the decimal number p starts with: an optional sign, digits with at most one
 * point (at least one digit in all), an optional exponent with digits; 0 when there is none. */
static size_t decimal_len(const char *p) {
  const char *q = p + (*p == '+' || *p == '-');
  size_t digits = strspn(q, DIGITS);
  q += digits;
  if (*q == '.') {
    size_t fraction = strspn(q + 1, DIGITS);
    q += 1 + fraction;
    digits += fraction;
  }
  if (!digits) return 0;
  if (*q == 'e' || *q == 'E') {
    const char *exponent = q + 1 + (q[1] == '+' || q[1] == '-');
    size_t exponent_digits = strspn(exponent, DIGITS);
    if (!exponent_digits) return 0;
    q = exponent + exponent_digits;
  }
  return (size_t)(q - p);
}

int metric_value_parse(const char *name, const char *text, double *value, nas_err *err) {
  if (nonfinite_word_check(name, text, err) != NAS_OK) return NAS_ERR;
  size_t len = strlen(text);
  /* decimal only: strtod alone also reads hexadecimal, "inf" and blanks before the number */
  if (!len || decimal_len(text) != len)
    return nas_errf(err, "metric \"%s\" is '%s', not a number (a decimal number: 3, -0.25, .5, "
                    "1e-3)", name, text);
  *value = strtod(text, NULL); /* past the double's range: ±inf, which metric_check refuses */
  return metric_check(name, *value, err);
}

char *metric_sem_name(const char *metric) {
  return nas_asprintf("%s%s", metric, METRIC_SEM_SUFFIX);
}

/* Checks the object of a metric line; *step gets its step (METRIC_FINAL when none). */
static int object_check(json_t *root, int64_t *step, nas_err *err) {
  if (!json_is_object(root)) return nas_errf(err, "metric line holds %s, not a JSON object",
                                             json_kind(root));
  *step = METRIC_FINAL;
  size_t n_metrics = 0;
  const char *key;
  json_t *value;
  json_object_foreach(root, key, value) {
    int rc = strcmp(key, "step") == 0 ? step_read(value, step, err)
                                      : value_check(key, value, err);
    if (rc != NAS_OK) return NAS_ERR;
    n_metrics += strcmp(key, "step") != 0;
  }
  if (n_metrics == 0) return nas_errf(err, "metric line holds no metric");
  return NAS_OK;
}

/* Parses and checks the JSON of a metric line into an owned *root. NAS_ERR: malformed.
 * Every number is read as a real (a metric is a double wherever it is stored), so an
 * integer past int64 is a value like any other, not "too big integer". */
static int line_check(const char *json, json_t **root, int64_t *step, nas_err *err) {
  char *quoted = nonfinite_quoted(json);
  if (!quoted) return nas_errf(err, "out of memory");
  json_error_t jerr;
  *root = json_loads(quoted, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
  free(quoted);
  if (!*root) return nas_errf(err, "malformed metric line: %s", jerr.text);
  if (object_check(*root, step, err) != NAS_OK) {
    json_decref(*root);
    *root = NULL;
    return NAS_ERR;
  }
  return NAS_OK;
}

/* Appends every metric of a checked object; all or none. */
static int object_append(json_t *root, int64_t step, double time, metric_set *set,
                         nas_err *err) {
  size_t n_before = set->n;
  const char *key;
  json_t *value;
  json_object_foreach(root, key, value) {
    if (strcmp(key, "step") == 0) continue;
    if (metric_set_add(set, key, step, json_number_value(value), time, err) != NAS_OK) {
      set_truncate(set, n_before);
      return NAS_ERR;
    }
  }
  return NAS_OK;
}

int metric_line_parse(const char *line, double time, metric_set *set, nas_err *err) {
  const char *json = metric_json_start(line, strlen(line));
  if (!json) return 0;
  json_t *root;
  int64_t step;
  if (line_check(json, &root, &step, err) != NAS_OK) return NAS_ERR;
  int rc = object_append(root, step, time, set, err);
  json_decref(root);
  return rc == NAS_OK ? 1 : NAS_ERR;
}

/* ---- a log file ---- */

/* One call's reading of a log. */
typedef struct {
  const char *path;
  metric_set *set;
  double time;       /* when the lines were read: the time of their observations */
  size_t bad;        /* malformed metric lines so far */
  nas_err first_bad; /* the first one's message */
  char *line;        /* the line being assembled: its first METRIC_LINE_MAX bytes */
  size_t line_len;
  bool overlong;     /* the line has more bytes than line holds */
  int64_t line_at;   /* file offset where the line starts */
  size_t obs_before;   /* set->n when the read began */
  size_t metric_bytes; /* bytes of the metric lines taken so far */
} log_reader;

/* Whether the read has taken as much as one read may. */
static bool reader_full(const log_reader *r) {
  return metric_report_full(r->set->n - r->obs_before, r->metric_bytes);
}

static void bad_line(log_reader *r, const char *message) {
  if (r->bad++ == 0)
    nas_errf(&r->first_bad, "%s, byte %lld: %s", r->path, (long long)r->line_at, message);
}

/* Takes one whole line (without its newline). Malformed metric lines are counted;
 * NAS_ERR only when the observations cannot be stored (out of memory). */
static int line_take(log_reader *r, nas_err *err) {
  const char *json = metric_json_start(r->line, r->line_len);
  if (!json) return NAS_OK;
  r->metric_bytes += r->line_len;
  if (r->overlong) {
    bad_line(r, "metric line longer than 64 KiB");
    return NAS_OK;
  }
  if (memchr(r->line, '\0', r->line_len)) {
    bad_line(r, "metric line holds a NUL byte");
    return NAS_OK;
  }
  r->line[r->line_len] = '\0';
  json_t *root;
  int64_t step;
  nas_err msg;
  if (line_check(json, &root, &step, &msg) != NAS_OK) {
    bad_line(r, msg.msg);
    return NAS_OK;
  }
  int rc = object_append(root, step, r->time, r->set, err);
  json_decref(root);
  return rc;
}

/* Adds bytes (no newline among them) to the line being assembled. */
static void line_extend(log_reader *r, const char *bytes, size_t n) {
  size_t room = METRIC_LINE_MAX - r->line_len;
  if (n > room) {
    r->overlong = true;
    n = room;
  }
  memcpy(r->line + r->line_len, bytes, n);
  r->line_len += n;
}

static void line_restart(log_reader *r, int64_t at) {
  r->line_len = 0;
  r->overlong = false;
  r->line_at = at;
}

/* Reads fd from *offset to its end, taking each complete line; *offset moves past the
 * last one, or to the end of the file when the last line is to be taken unfinished. A
 * read that is full (reader_full) stops after its line, and *more is set when it did. */
static int lines_read(log_reader *r, int fd, int64_t *offset, bool take_unfinished,
                      bool *more, nas_err *err) {
  char *block = malloc(READ_BLOCK);
  if (!block) return nas_errf(err, "%s: out of memory", r->path);
  int64_t pos = *offset;
  line_restart(r, pos);
  int rc = NAS_OK;
  *more = false;
  while (!*more) {
    ssize_t got = pread(fd, block, READ_BLOCK, (off_t)pos);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) rc = nas_errf(err, "%s: %s", r->path, strerror(errno));
    if (got <= 0) break;
    for (const char *p = block, *end = block + got; p < end && rc == NAS_OK && !*more;) {
      const char *newline = memchr(p, '\n', (size_t)(end - p));
      line_extend(r, p, (size_t)((newline ? newline : end) - p));
      pos += (newline ? newline + 1 : end) - p;
      p = newline ? newline + 1 : end;
      if (!newline) continue;
      rc = line_take(r, err);
      line_restart(r, pos);
      *offset = pos;
      *more = reader_full(r);
    }
    if (rc != NAS_OK) break;
  }
  if (rc == NAS_OK && !*more && take_unfinished && pos > r->line_at) {
    rc = line_take(r, err);
    *offset = pos;
  }
  free(block);
  return rc;
}

static int log_read(const char *path, int64_t *offset, metric_set *set, metric_log_notes *notes,
                    bool to_end, nas_err *err) {
  if (*offset < 0) return nas_errf(err, "%s: negative offset %lld", path, (long long)*offset);
  int fd;
  int64_t size = 0;
  int opened = nas_open_regular(path, &fd, &size, err);
  if (opened == NAS_ENOTFOUND) return NAS_OK;
  if (opened != NAS_OK) return opened;
  /* Shorter than what was read: truncated (a job's log is only ever appended to), so its
   * new content starts at 0. */
  int64_t shrank_from = size < *offset ? *offset : 0;
  size_t n_before = set->n;
  log_reader r = {.path = path, .set = set, .time = nas_now(), .line = malloc(METRIC_LINE_MAX + 1),
                  .obs_before = n_before};
  int64_t new_offset = shrank_from ? 0 : *offset;
  bool more = false;
  int rc = r.line ? lines_read(&r, fd, &new_offset, to_end, &more, err)
                  : nas_errf(err, "%s: out of memory", path);
  close(fd);
  free(r.line);
  if (rc != NAS_OK) {
    set_truncate(set, n_before);
    return NAS_ERR;
  }
  *offset = new_offset;
  if (!notes) return NAS_OK;
  notes->bad += r.bad;
  if (r.bad) notes->first_bad = r.first_bad;
  notes->shrank_from = shrank_from;
  notes->more = more;
  return NAS_OK;
}

int metric_log_read(const char *path, int64_t *offset, metric_set *set, metric_log_notes *notes,
                    nas_err *err) {
  return log_read(path, offset, set, notes, false, err);
}

int metric_log_read_rest(const char *path, int64_t *offset, metric_set *set,
                         metric_log_notes *notes, nas_err *err) {
  return log_read(path, offset, set, notes, true, err);
}
