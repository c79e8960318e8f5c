/* common: error messages, clocks, files and small string helpers (see common.h). */
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Ends text, cut to fit its buffer, before a UTF-8 character the cut left incomplete: a
 * message must stay UTF-8 to go out as JSON (a storage server's error replies). */
static void drop_cut_char(char *text) {
  size_t len = strlen(text), lead = len;
  while (lead > 0 && len - lead < 3 && ((unsigned char)text[lead - 1] & 0xc0) == 0x80) lead--;
  if (lead-- == 0) return;
  unsigned char first = (unsigned char)text[lead];
  size_t need = first >= 0xf0 ? 4 : first >= 0xe0 ? 3 : first >= 0xc0 ? 2 : 1;
  if (len - lead < need) text[lead] = '\0';
}

static int errv(nas_err *err, int code, const char *fmt, va_list ap) {
  if (err && vsnprintf(err->msg, sizeof err->msg, fmt, ap) >= (int)sizeof err->msg)
    drop_cut_char(err->msg);
  return code;
}

int nas_errf(nas_err *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = errv(err, NAS_ERR, fmt, ap);
  va_end(ap);
  return rc;
}

int nas_errc(nas_err *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = errv(err, code, fmt, ap);
  va_end(ap);
  return rc;
}

int nas_err_prefix(nas_err *err, const char *fmt, ...) {
  if (!err) return NAS_ERR;
  /* Room for the prefix and the old message together; the result is cut to fit. */
  char joined[sizeof err->msg * 2];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(joined, sizeof err->msg, fmt, ap);
  va_end(ap);
  if (n >= (int)sizeof err->msg) drop_cut_char(joined);
  size_t used = n < 0 ? 0 : strlen(joined);
  snprintf(joined + used, sizeof joined - used, ": %s", err->msg);
  bool cut = strlen(joined) >= sizeof err->msg;
  memcpy(err->msg, joined, sizeof err->msg - 1);
  err->msg[sizeof err->msg - 1] = '\0';
  if (cut) drop_cut_char(err->msg);
  return NAS_ERR;
}

static double clock_seconds(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double nas_now(void) { return clock_seconds(CLOCK_REALTIME); }
double nas_monotonic(void) { return clock_seconds(CLOCK_MONOTONIC); }

void nas_sleep(double seconds) {
  if (seconds <= 0) return;
  struct timespec ts = {.tv_sec = (time_t)seconds,
                        .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The length of the well-formed UTF-8 character at s (RFC 3629, as jansson checks it), or 0
 * when s does not begin one; never reads past a NUL. */
static size_t utf8_char_len(const unsigned char *s) {
  unsigned char first = s[0], low = 0x80, high = 0xbf; /* the second byte's range */
  size_t len;
  if (first < 0x80) return 1;
  if (first >= 0xc2 && first <= 0xdf) len = 2;
  else if (first >= 0xe0 && first <= 0xef) len = 3;
  else if (first >= 0xf0 && first <= 0xf4) len = 4;
  else return 0;
  if (first == 0xe0) low = 0xa0;  /* overlong */
  if (first == 0xed) high = 0x9f; /* surrogates */
  if (first == 0xf0) low = 0x90;  /* overlong */
  if (first == 0xf4) high = 0x8f; /* above U+10FFFF */
  if (s[1] < low || s[1] > high) return 0;
  for (size_t i = 2; i < len; i++)
    if (s[i] < 0x80 || s[i] > 0xbf) return 0;
  return len;
}

bool nas_is_utf8(const char *text) {
  const unsigned char *s = (const unsigned char *)text;
  for (size_t len; *s; s += len)
    if ((len = utf8_char_len(s)) == 0) return false;
  return true;
}

char *nas_utf8_repaired(const char *text) {
  static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */
  const unsigned char *s = (const unsigned char *)text;
  char *out = malloc(3 * strlen(text) + 1), *end = out; /* each byte may become 3 */
  if (!out) return NULL;
  while (*s) {
    size_t len = utf8_char_len(s);
    memcpy(end, len ? (const char *)s : replacement, len ? len : 3);
    end += len ? len : 3;
    s += len ? len : 1;
  }
  *end = '\0';
  return out;
}

int nas_open_regular(const char *path, int *fd, int64_t *size, nas_err *err) {
  /* O_NONBLOCK: opening a FIFO with no writer would wait for one */
  *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (*fd < 0 && errno == ENOENT) return NAS_ENOTFOUND;
  if (*fd < 0) return nas_errf(err, "%s: %s", path, strerror(errno));
  struct stat st;
  const char *problem = fstat(*fd, &st) != 0 ? strerror(errno)
                        : !S_ISREG(st.st_mode) ? "not a regular file"
                                               : NULL;
  if (!problem) {
    *size = (int64_t)st.st_size;
    return NAS_OK;
  }
  close(*fd);
  *fd = -1;
  return nas_errf(err, "%s: %s", path, problem);
}

int nas_check_private(const char *path, const char *what, nas_err *err) {
  struct stat st;
  if (stat(path, &st) != 0) return nas_errf(err, "%s %s: %s", what, path, strerror(errno));
  if (S_ISDIR(st.st_mode)) return nas_errf(err, "%s %s: a folder, not a token file", what, path);
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    return nas_errf(err, "%s %s may be read by others (mode %03o); make it private: "
                    "chmod 600 %s", what, path, (unsigned)(st.st_mode & 0777), path);
  return NAS_OK;
}

int nas_read_file(const char *path, char **out, size_t *len, nas_err *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return nas_errf(err, "%s: %s", path, strerror(errno));
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n - 1, f);
    if (n < cap - 1) break;
    char *bigger = realloc(buf, cap * 2);
    if (!bigger) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = bigger;
    cap *= 2;
  }
  int read_error = ferror(f);
  fclose(f);
  if (!buf) return nas_errf(err, "%s: out of memory", path);
  if (read_error) {
    free(buf);
    return nas_errf(err, "%s: read error", path);
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return NAS_OK;
}

/* exact: the bits are mode itself, not mode less the umask, whatever the temporary file
 * was (one left by a crash keeps its old bits through O_TRUNC). */
static int write_atomic(const char *path, const char *data, size_t len, mode_t mode,
                        bool exact, nas_err *err) {
  char *tmp = nas_asprintf("%s.tmp.%ld", path, (long)getpid());
  if (!tmp) return nas_errf(err, "%s: out of memory", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd >= 0 && exact && fchmod(fd, mode) != 0) {
    int fchmod_errno = errno;
    close(fd);
    fd = -1;
    errno = fchmod_errno;
  }
  if (fd < 0) {
    int rc = nas_errf(err, "%s: %s", tmp, strerror(errno));
    free(tmp);
    return rc;
  }
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, data + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) break;
    done += (size_t)w;
  }
  int ok = done == len && fsync(fd) == 0;
  ok = (close(fd) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    int rc = nas_errf(err, "%s: %s", path, strerror(errno));
    unlink(tmp);
    free(tmp);
    return rc;
  }
  free(tmp);
  return NAS_OK;
}

int nas_write_file_atomic(const char *path, const char *data, size_t len, nas_err *err) {
  return write_atomic(path, data, len, 0644, false, err);
}

int nas_write_file_atomic_mode(const char *path, const char *data, size_t len, unsigned mode,
                               nas_err *err) {
  return write_atomic(path, data, len, (mode_t)mode, true, err);
}

int nas_fsync_dir(const char *dir, nas_err *err) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = fd >= 0 && fsync(fd) == 0 ? NAS_OK
                                     : nas_errf(err, "%s: cannot sync: %s", dir, strerror(errno));
  if (fd >= 0) close(fd);
  return rc;
}

int nas_mkdirs(const char *path, nas_err *err) {
  char *copy = strdup(path);
  if (!copy) return nas_errf(err, "%s: out of memory", path);
  for (char *p = copy + 1;; p++) {
    bool end = *p == '\0';
    if (*p == '/' || end) {
      *p = '\0';
      if (mkdir(copy, 0755) != 0 && errno != EEXIST) {
        int rc = nas_errf(err, "cannot create folder %s: %s", copy, strerror(errno));
        free(copy);
        return rc;
      }
      if (end) break;
      *p = '/';
    }
  }
  free(copy);
  return NAS_OK;
}

/* Appends segment to the normalised absolute path in out (capacity cap), resolving "."
 * and "..". */
static void push_segment(char *out, size_t cap, const char *seg, size_t seglen) {
  if (seglen == 0 || (seglen == 1 && seg[0] == '.')) return;
  if (seglen == 2 && seg[0] == '.' && seg[1] == '.') {
    char *slash = strrchr(out, '/');
    if (slash) *(slash == out ? slash + 1 : slash) = '\0';
    return;
  }
  size_t n = strlen(out);
  if (n > 1 || out[0] != '/') out[n++] = '/';
  size_t room = cap - n - 1;
  if (seglen > room) seglen = room;
  memcpy(out + n, seg, seglen);
  out[n + seglen] = '\0';
}

char *nas_abspath(const char *path, const char *base) {
  char cwd[4096];
  char *joined;
  if (path[0] == '/') {
    joined = strdup(path);
  } else if (base) {
    char *abs_base = nas_abspath(base, NULL);
    joined = abs_base ? nas_asprintf("%s/%s", abs_base, path) : NULL;
    free(abs_base);
  } else {
    if (!getcwd(cwd, sizeof cwd)) return NULL;
    joined = nas_asprintf("%s/%s", cwd, path);
  }
  if (!joined) return NULL;
  size_t cap = strlen(joined) + 2;
  char *out = malloc(cap);
  if (out) {
    strcpy(out, "/");
    for (const char *s = joined; *s;) {
      while (*s == '/') s++;
      const char *e = strchr(s, '/');
      size_t len = e ? (size_t)(e - s) : strlen(s);
      push_segment(out, cap, s, len);
      s += len;
    }
  }
  free(joined);
  return out;
}

char *nas_dirname(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

int nas_check_experiment_name(const char *name, nas_err *err) {
  size_t len = 0;
  for (char ch = name[0]; ch; ch = name[++len]) {
    bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
    if (!alnum && (len == 0 || !strchr("_.-", ch))) break;
  }
  if (len > 0 && name[len] == '\0' && len <= NAS_EXPERIMENT_NAME_MAX) return NAS_OK;
  return nas_errf(err,
                  "'%.40s%s' is not an experiment name: a letter or digit, then letters, "
                  "digits, '_', '.' or '-', at most %d characters",
                  name, strlen(name) > 40 ? "..." : "", NAS_EXPERIMENT_NAME_MAX);
}

int nas_memstream_close(FILE *stream, char **buf, nas_err *err) {
  bool failed = ferror(stream) != 0;
  failed = fclose(stream) != 0 || failed;
  if (!failed && *buf) return NAS_OK;
  free(*buf);
  *buf = NULL;
  return nas_errf(err, "out of memory");
}

char *nas_asprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *out = NULL;
  int n = vasprintf(&out, fmt, ap);
  va_end(ap);
  return n < 0 ? NULL : out;
}

char *nas_shell_quote(const char *s) {
  size_t quotes = 0;
  for (const char *p = s; *p; p++) quotes += *p == '\'';
  char *out = malloc(strlen(s) + 3 * quotes + 3);
  if (!out) return NULL;
  char *w = out;
  *w++ = '\'';
  for (const char *p = s; *p; p++) {
    if (*p == '\'') { /* close the quote, an escaped quote, open again: '\'' */
      memcpy(w, "'\\''", 4);
      w += 4;
    } else {
      *w++ = *p;
    }
  }
  *w++ = '\'';
  *w = '\0';
  return out;
}

size_t nas_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  size_t *row = malloc((lb + 1) * sizeof *row);
  if (!row) return SIZE_MAX;
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  size_t d = row[lb];
  free(row);
  return d;
}

void nas_log(const char *fmt, ...) {
  char stamp[32];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s nas: ", stamp);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

const char *nas_nearest(const char *word, const char *const *names, size_t n) {
  const char *best = NULL;
  size_t best_distance = 3, word_len = strlen(word);
  for (size_t i = 0; i < n; i++) {
    size_t distance = nas_edit_distance(word, names[i]);
    if (distance < best_distance && distance < word_len) {
      best = names[i];
      best_distance = distance;
    }
  }
  return best;
}

void nas_json_error_where(const struct json_error_t *e, int *line, int *column) {
  bool cut_short = json_error_code(e) == json_error_premature_end_of_input;
  *line = e->line > 0 ? e->line : 1;
  *column = e->column + (cut_short || e->column < 1);
}
