/* common: small helpers every module shares.
 *
 * Errors: a function that can fail returns 0 on success and a negative NAS_E* code on
 * failure, after writing a one-line message with its context ("file:line:col: …",
 * "trial 7: …") into the caller's nas_err. Only cli/ decides how a process ends. */
#ifndef NAS_COMMON_H
#define NAS_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum {
  NAS_OK = 0,
  NAS_ERR = -1,       /* any failure; the message says what */
  NAS_ENOTFOUND = -2, /* the thing asked for does not exist */
  NAS_EEXIST = -3,    /* the thing to create exists already */
  NAS_ECANCELED = -4, /* given up because the caller asked (a signal, `nas stop`) */
  NAS_EINVAL = -5,    /* the request does not fit what exists (a missing objective, …) */
};

/* The message of the last failure, filled by nas_errf. */
typedef struct nas_err {
  char msg[1024];
} nas_err;

/* Writes a printf-style message into err (which may be NULL) and returns NAS_ERR, so a
 * failing path reads `return nas_errf(err, "...", ...);`. */
int nas_errf(nas_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, returning `code` instead of NAS_ERR. */
int nas_errc(nas_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Puts "prefix: " in front of the message already in err; returns NAS_ERR. */
int nas_err_prefix(nas_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Wall-clock time as Unix seconds, and a monotonic clock in seconds for intervals. */
double nas_now(void);
double nas_monotonic(void);
/* Sleeps for the given seconds (fractions allowed). */
void nas_sleep(double seconds);

/* Whether text is well-formed UTF-8 (jansson's check: no overlong form, no surrogate,
 * nothing above U+10FFFF), as every name and message stored must be to go out as JSON. */
bool nas_is_utf8(const char *text);
/* text made well-formed UTF-8: each byte that does not begin a well-formed character is
 * replaced by U+FFFD. Owned; NULL when out of memory. */
char *nas_utf8_repaired(const char *text);
/* Opens a log or data file to read that must be a regular file: a FIFO or a device put in
 * its place (by a trial, in its own run folder) would block the reader or never end. *fd
 * (O_CLOEXEC) and *size on NAS_OK; NAS_ENOTFOUND when it does not exist (err untouched). */
int nas_open_regular(const char *path, int *fd, int64_t *size, nas_err *err);
/* Refuses a file of secrets (what: how the message names it, "token file") that its group
 * or others may read or write, as ssh refuses such a key, saying how to make it private;
 * and a folder. Checked before the file is read. */
int nas_check_private(const char *path, const char *what, nas_err *err);
/* Reads a whole file into a NUL-terminated owned buffer; *len gets its size if not NULL. */
int nas_read_file(const char *path, char **out, size_t *len, nas_err *err);
/* Writes data to path atomically (temporary file in the same folder, fsync, rename). */
int nas_write_file_atomic(const char *path, const char *data, size_t len, nas_err *err);
/* The same with the file's permission bits (0600: only its owner reads it) set before any
 * byte is written. nas_write_file_atomic is this with 0644 (less the umask). */
int nas_write_file_atomic_mode(const char *path, const char *data, size_t len, unsigned mode,
                               nas_err *err);
/* fsync of folder dir: what was renamed into it or created there lasts through a power loss. */
int nas_fsync_dir(const char *dir, nas_err *err);
/* mkdir -p. */
int nas_mkdirs(const char *path, nas_err *err);
/* Owned absolute form of path (relative to base when base is not NULL, else to the
 * current directory); the path need not exist. Removes "." and "x/.." segments. */
char *nas_abspath(const char *path, const char *base);
/* Owned copy of the directory part of path ("." when there is none). */
char *nas_dirname(const char *path);

/* Whether name may name an experiment, which becomes a folder (runs/<name>) and a command
 * argument (`nas resume NAME`): a letter or digit (so never '.', '..' or '--option'), then
 * letters, digits, '_', '.' or '-', at most 64. Checked where a spec is read and again
 * where storage stores a name (a client of `nas serve` can send any). */
#define NAS_EXPERIMENT_NAME_MAX 64
int nas_check_experiment_name(const char *name, nas_err *err);

/* Closes a stream made by open_memstream(buf, …). NAS_OK: *buf is the owned text. NAS_ERR
 * ("out of memory" in err, which may be NULL): a write or the final resize failed, and *buf
 * is freed and NULL. glibc's fclose reports a failed final resize only by leaving *buf
 * NULL, so checking its result alone is not enough. */
int nas_memstream_close(FILE *stream, char **buf, nas_err *err);

/* Owned printf. Returns NULL only when out of memory. */
char *nas_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Owned copy of s as one single-quoted shell word that reads back as exactly s, whatever
 * bytes it holds ("it's" becomes 'it'\''s'). NULL only when out of memory. */
char *nas_shell_quote(const char *s);

/* Levenshtein distance, for "did you mean" suggestions. */
size_t nas_edit_distance(const char *a, const char *b);
/* The name in names[0..n) nearest to word when it is a likely typo (at most 2 edits, and
 * fewer than word has letters), else NULL; borrowed from names. */
const char *nas_nearest(const char *word, const char *const *names, size_t n);

/* Where jansson's error e is, as line:column (both from 1) like every file:line:column
 * message: jansson counts the characters it has read on the line, so at an input cut
 * short the place is one past them (it said column 0 after a last newline). */
struct json_error_t;
void nas_json_error_where(const struct json_error_t *e, int *line, int *column);

/* Log lines to stderr: "2026-11-23T05:03:35Z nas: message". */
void nas_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
