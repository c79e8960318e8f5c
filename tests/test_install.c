/* `make install`, `make uninstall` and `make deb` as a user meets them: installed into a
 * DESTDIR, the installed nas runs the built-in digits demo from another folder with the
 * data it installed (no NAS_DATA_DIR, no source tree), the completion and the Python
 * client load, uninstall leaves nothing, and the Debian package holds the same files with
 * its libraries declared. Run from the repository root, against the nas of NAS_BIN (never
 * rebuilt here: make gets `-o` for it); the man page is made in the test's folder. */
#include "tests/testutil.h"

#include <libgen.h>
#include <limits.h>
#include <sys/stat.h>

#include "common/common.h"

typedef struct {
  char *dir;  /* fresh folder: build/, root/ (the DESTDIR), elsewhere/ */
  char *bin;  /* absolute path of the nas under test */
  char *make_vars[4]; /* BIN=…, BUILD=…, -o, the nas binary as make names it */
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dir = test_tmpdir();
  f->bin = realpath(test_nas_bin(), NULL);
  assert_non_null(f->bin);
  char bin_dir[PATH_MAX];
  snprintf(bin_dir, sizeof bin_dir, "%s", f->bin);
  assert_true(asprintf(&f->make_vars[0], "BIN=%s", dirname(bin_dir)) > 0);
  assert_true(asprintf(&f->make_vars[1], "BUILD=%s/build", f->dir) > 0);
  f->make_vars[2] = strdup("-o");
  f->make_vars[3] = strdup(f->bin);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  test_rmtree(f->dir);
  for (int i = 0; i < 4; i++) free(f->make_vars[i]);
  free(f->dir), free(f->bin), free(f);
  return 0;
}

/* `make -s TARGET DESTDIR=<dir>/root PREFIX=/usr` with the fixture's BIN and BUILD. */
static void make_target(fixture *f, const char *target) {
  char *destdir = NULL, *out = NULL;
  assert_true(asprintf(&destdir, "DESTDIR=%s/root", f->dir) > 0);
  char *argv[] = {"make", "-s", "--no-print-directory", (char *)target, destdir, "PREFIX=/usr",
                  f->make_vars[0], f->make_vars[1], f->make_vars[2], f->make_vars[3], NULL};
  int rc = test_run(NULL, argv, &out);
  if (rc != 0) fail_msg("make %s failed (%d): %s", target, rc, out);
  free(out), free(destdir);
}

/* Runs `sh -c script sh ARG…` in dir; fails the test unless it exits 0. Owned output. */
static char *sh_ok(const char *dir, const char *script, const char *arg1, const char *arg2) {
  char *argv[] = {"sh", "-c", (char *)script, "sh", (char *)arg1, (char *)arg2, NULL}, *out;
  if (!arg1) argv[4] = NULL;
  int rc = test_run(dir, argv, &out);
  if (rc != 0) fail_msg("'%s' failed (%d): %s", script, rc, out);
  return out;
}

static char *path_in(const fixture *f, const char *name) {
  char *path = NULL;
  assert_true(asprintf(&path, "%s/%s", f->dir, name) > 0);
  return path;
}

/* The installed digits demo with a budget of seconds: 2 trials of 1 epoch. */
static char *tiny_demo_spec(const char *elsewhere, const char *root) {
  char *text = NULL, *example = NULL;
  assert_true(asprintf(&example, "%s/usr/share/nas/examples/digits-nas.yaml", root) > 0);
  assert_int_equal(nas_read_file(example, &text, NULL, NULL), 0);
  char *budget = strstr(text, "budget: {trials: 16"), *epochs = strstr(text, "epochs: 10");
  assert_non_null(budget);
  assert_non_null(epochs);
  memcpy(budget, "budget: {trials:  2", strlen("budget: {trials: 16"));
  memcpy(epochs, "epochs:  1", strlen("epochs: 10"));
  char *spec = test_write(elsewhere, "demo.yaml", text);
  free(text), free(example);
  return spec;
}

static void installed_nas_runs_the_demo_from_elsewhere_and_uninstall_leaves_nothing(void **state) {
  fixture *f = *state;
  make_target(f, "install");
  char *root = path_in(f, "root"), *elsewhere = path_in(f, "elsewhere"), *out;
  assert_int_equal(mkdir(elsewhere, 0755), 0);
  out = sh_ok(root,
              "test -x usr/bin/nas && test -f usr/share/nas/digits.csv.gz &&"
              " zcat usr/share/man/man1/nas.1.gz | grep -q '^\\.TH NAS 1' &&"
              " bash -c '. usr/share/bash-completion/completions/nas && complete -p nas' &&"
              " test -f usr/share/zsh/site-functions/_nas &&"
              " PYTHONPATH=usr/share/nas/python python3 -c 'import nas_client'",
              NULL, NULL);
  free(out);

  /* The demo, with the data the installed nas finds beside itself. */
  char *spec = tiny_demo_spec(elsewhere, root), *data_dir = NULL;
  if (getenv("NAS_DATA_DIR")) data_dir = strdup(getenv("NAS_DATA_DIR"));
  unsetenv("NAS_DATA_DIR");
  char *nas = NULL;
  assert_true(asprintf(&nas, "%s/usr/bin/nas", root) > 0);
  char *run[] = {nas, "run", spec, "--no-progress", NULL};
  int rc = test_run(elsewhere, run, &out);
  if (data_dir) setenv("NAS_DATA_DIR", data_dir, 1);
  if (rc != 0) fail_msg("installed nas run failed (%d): %s", rc, out);
  free(out);
  char *pareto[] = {nas, "trials", "digits-nas", "--format", "csv", NULL};
  assert_int_equal(test_run(elsewhere, pareto, &out), 0);
  assert_non_null(strstr(out, "completed"));
  assert_null(strstr(out, "failed"));
  free(out);

  make_target(f, "uninstall");
  out = sh_ok(root, "find . ! -type d; test ! -e usr/share/nas && echo gone", NULL, NULL);
  assert_string_equal(out, "gone\n");
  free(out), free(nas), free(spec), free(data_dir), free(root), free(elsewhere);
}

static void deb_holds_the_installed_files_as_root_and_declares_its_libraries(void **state) {
  fixture *f = *state;
  make_target(f, "deb");
  char *build = path_in(f, "build");
  char *deb = sh_ok(build, "ls nas_*_*.deb", NULL, NULL);
  deb[strcspn(deb, "\n")] = '\0';
  char *out = sh_ok(build, "dpkg-deb -f \"$1\" Package Depends", deb, NULL);
  static const char *const libs[] = {"libgsl", "libopenblas", "libnlopt", "libpq5", "libsqlite3",
                                     "libyaml", "libjansson", "libmicrohttpd", "libc6"};
  for (size_t i = 0; i < sizeof libs / sizeof *libs; i++)
    if (!strstr(out, libs[i])) fail_msg("Depends lacks %s: %s", libs[i], out);
  assert_non_null(strstr(out, "Package: nas\n"));
  free(out);
  out = sh_ok(build, "dpkg-deb -c \"$1\"", deb, NULL);
  static const char *const files[] = {"./usr/bin/nas\n", "./usr/share/man/man1/nas.1.gz\n",
                                      "./usr/share/nas/digits.csv.gz\n",
                                      "./usr/share/nas/python/nas_client.py\n",
                                      "./usr/share/bash-completion/completions/nas\n",
                                      "./usr/share/zsh/site-functions/_nas\n",
                                      "./usr/lib/python3/dist-packages/nas_client.py -> "
                                      "/usr/share/nas/python/nas_client.py\n"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++)
    if (!strstr(out, files[i])) fail_msg("package lacks %s", files[i]);
  char *line = out;
  for (char *next; *line; line = next + 1) { /* every entry belongs to root */
    next = strchr(line, '\n');
    assert_non_null(next);
    assert_int_equal(strncmp(strchr(line, ' ') + 1, "root/root ", 10), 0);
  }
  free(out);
  out = sh_ok(build, "dpkg-deb -x \"$1\" x && x/usr/bin/nas --version", deb, NULL);
  assert_int_equal(strncmp(out, "nas ", 4), 0);
  free(out), free(deb), free(build);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          installed_nas_runs_the_demo_from_elsewhere_and_uninstall_leaves_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(
          deb_holds_the_installed_files_as_root_and_declares_its_libraries, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
