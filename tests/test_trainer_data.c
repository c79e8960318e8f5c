/* Data loading (IDX and CSV, gzip or plain), split, normalisation and batching, and the
 * end-to-end check: an MLP trained on scikit-learn's digits (tests/data/digits.csv.gz)
 * reaches at least 95% validation accuracy. */
#include "tests/testutil.h"

#include <math.h>
#include <sys/stat.h>
#include <zlib.h>

#include "trainer/trainer.h"

#define DIGITS "tests/data/digits.csv.gz"

/* Writes bytes to dir/name, gzip-compressed when gz. Returns the owned path. */
static char *write_bytes(const char *dir, const char *name, const unsigned char *data, size_t n,
                         bool gz) {
  char *path = nas_asprintf("%s/%s", dir, name);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, data, (unsigned)n), (int)n);
    gzclose(f);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
  }
  return path;
}

static void idx_loader_reads_gzip_and_plain_files(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  /* 3 images of 2x2, labels 4, 0, 2 */
  const unsigned char images[] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2,  0,  0,
                                  0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 255};
  const unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 3, 4, 0, 2};
  for (int gz = 0; gz < 2; gz++) {
    char *ip = write_bytes(dir, gz ? "i.gz" : "i", images, sizeof images, gz);
    char *lp = write_bytes(dir, gz ? "l.gz" : "l", labels, sizeof labels, gz);
    tr_ctx ctx;
    tr_ctx_init(&ctx, 1);
    tr_dataset ds;
    assert_int_equal(tr_idx_load(&ctx, ip, lp, &ds), NAS_OK);
    assert_int_equal(ds.n, 3);
    assert_int_equal(ds.x->ndim, 3);
    assert_int_equal(ds.x->shape[1], 2);
    assert_int_equal(ds.nclasses, 5);
    assert_true(tr_get(ds.x, 11) == 255.0f && tr_get(ds.x, 4) == 5.0f);
    assert_int_equal(ds.y[0], 4);
    assert_int_equal(ds.y[2], 2);
    tr_dataset_free(&ds);
    /* an images file where the labels should be */
    assert_int_equal(tr_idx_load(&ctx, ip, ip, &ds), NAS_ERR);
    assert_non_null(strstr(ctx.err.msg, "labels for"));
    free(ip);
    free(lp);
  }
  char *bad = write_bytes(dir, "bad", (const unsigned char *)"PK\3\4", 4, false);
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_dataset ds;
  assert_int_equal(tr_idx_load(&ctx, bad, bad, &ds), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "not an IDX file"));
  free(bad);
  test_rmtree(dir);
  free(dir);
}

/* The real Fashion-MNIST test set (Debian dataset-fashion-mnist, scripts/deps.sh datasets):
 * skipped, saying so, where the package is not installed. */
static void fashion_mnist_test_set_loads_when_installed(void **state) {
  (void)state;
  const char *dir = "/usr/share/datasets/fashion-mnist";
  char *images = nas_asprintf("%s/t10k-images-idx3-ubyte.gz", dir);
  char *labels = nas_asprintf("%s/t10k-labels-idx1-ubyte.gz", dir);
  if (access(images, R_OK) != 0 || access(labels, R_OK) != 0) {
    print_message("skipped: %s is missing (apt-get install dataset-fashion-mnist)\n", images);
    free(images);
    free(labels);
    skip();
  }
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_dataset ds;
  assert_int_equal(tr_idx_load(&ctx, images, labels, &ds), NAS_OK);
  assert_int_equal(ds.n, 10000);
  assert_int_equal(ds.x->shape[1], 28);
  assert_int_equal(ds.x->shape[2], 28);
  assert_int_equal(ds.nclasses, 10);
  int counts[10] = {0}; /* the test set has 1000 of each class */
  for (int64_t i = 0; i < ds.n; i++) counts[ds.y[i]]++;
  for (int k = 0; k < 10; k++) assert_int_equal(counts[k], 1000);
  tr_dataset_free(&ds);
  free(images);
  free(labels);
}

static void csv_loader_skips_a_header_and_reports_bad_lines(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  char *path = test_write(dir, "d.csv", "label,a,b\n1,0.5,2\n\n0,1.5,-3\n2,2.5,4\n");
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2);
  tr_dataset ds;
  assert_int_equal(tr_csv_load(&ctx, path, 0, &ds), NAS_OK);
  assert_int_equal(ds.n, 3);
  assert_int_equal(ds.x->shape[1], 2);
  assert_int_equal(ds.nclasses, 3);
  assert_int_equal(ds.y[1], 0);
  assert_true(tr_get(ds.x, 3) == -3.0f);
  tr_dataset_free(&ds);
  free(path);
  path = test_write(dir, "e.csv", "1,2,0\n3,x,1\n");
  assert_int_equal(tr_csv_load(&ctx, path, -1, &ds), NAS_ERR);
  assert_non_null(strstr(ctx.err.msg, "e.csv:2"));
  free(path);
  test_rmtree(dir);
  free(dir);
}

/* Loads path as CSV (label last) expecting an error that holds want. */
static void csv_fails_with(const char *path, const char *want) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_dataset ds;
  int rc = tr_csv_load(&ctx, path, -1, &ds);
  if (rc == NAS_OK) {
    tr_dataset_free(&ds);
    fail_msg("%s loaded; expected an error with '%s'", path, want);
  }
  if (!strstr(ctx.err.msg, want)) fail_msg("'%s' does not say '%s'", ctx.err.msg, want);
}

/* Loads path as CSV (label last) into ds, failing the test on an error. */
static void csv_loads(const char *path, tr_dataset *ds) {
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  if (tr_csv_load(&ctx, path, -1, ds)) fail_msg("%s", ctx.err.msg);
}

/* An IDX images file whose header claims dims (3 images of whatever size they say, with
 * 4 bytes of data) beside labels for 3 images: loading it fails naming it and saying want. */
static void idx_fails_with(int ndims, const uint32_t *dims, const char *want) {
  char *dir = test_tmpdir();
  unsigned char images[4 + 4 * 4 + 4] = {0, 0, 8, (unsigned char)ndims};
  for (int d = 0; d < ndims; d++)
    for (int b = 0; b < 4; b++) images[4 + 4 * d + b] = (unsigned char)(dims[d] >> (24 - 8 * b));
  const unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 0, 2};
  char *ip = write_bytes(dir, "i", images, 4 + 4 * (size_t)ndims + 4, false);
  char *lp = write_bytes(dir, "l", labels, sizeof labels, false);
  tr_ctx ctx;
  tr_ctx_init(&ctx, 1);
  tr_dataset ds;
  int rc = tr_idx_load(&ctx, ip, lp, &ds);
  if (rc == NAS_OK) {
    tr_dataset_free(&ds);
    fail_msg("IDX dims loaded; expected an error with '%s'", want);
  }
  if (!strstr(ctx.err.msg, want) || !strstr(ctx.err.msg, ip))
    fail_msg("'%s' does not name %s and say '%s'", ctx.err.msg, ip, want);
  free(ip);
  free(lp);
  test_rmtree(dir);
  free(dir);
}

static void idx_dims_whose_product_overflows_are_refused(void **state) {
  (void)state;
  /* 3 x 2^31 x 2^31 x 4 values: 3 * 2^64, which wraps to 0 in 64 bits */
  idx_fails_with(4, (const uint32_t[]){3, 1u << 31, 1u << 31, 4}, "truncated");
}

static void idx_examples_of_no_values_are_refused(void **state) {
  (void)state;
  idx_fails_with(3, (const uint32_t[]){3, 0, 2}, "size 0");
}

static void idx_data_longer_than_its_dims_say_is_refused(void **state) {
  (void)state;
  /* 3 images of 1x1: 3 values, and the file holds 4 */
  idx_fails_with(3, (const uint32_t[]){3, 1, 1}, "1 byte past");
}

/* A gzip file flushed after the first rows and cut there: zlib gives those rows, then
 * "unexpected end of file". */
static void gzip_file_cut_short_is_an_error_not_fewer_rows(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  char *path = nas_asprintf("%s/cut.csv.gz", dir);
  gzFile f = gzopen(path, "wb");
  assert_non_null(f);
  const char *rows = "1,2,0\n3,4,1\n";
  assert_int_equal(gzputs(f, rows), (int)strlen(rows));
  assert_int_equal(gzflush(f, Z_FULL_FLUSH), Z_OK);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_true(gzputs(f, "5,6,2\n") > 0);
  gzclose(f);
  assert_int_equal(truncate(path, st.st_size), 0);
  csv_fails_with(path, "unexpected end of file");
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void csv_nan_or_infinite_values_are_refused(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *rows[] = {"1,2,0\n3,nan,1\n", "1,2,0\n3,inf,1\n", "1,2,0\n3,-Infinity,1\n",
                        "1,2,0\n3,4,nan\n", "1,2,0\n3,1e999,1\n"};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    char *path = test_write(dir, "n.csv", rows[i]);
    csv_fails_with(path, "n.csv:2");
    free(path);
  }
  /* in the first row too: numbers, if not finite ones, make no header to skip */
  char *path = test_write(dir, "first.csv", "1,nan,0\n3,4,1\n");
  csv_fails_with(path, "first.csv:1:");
  free(path);
  test_rmtree(dir);
  free(dir);
}

/* A value a double holds but float32 does not (past ±3.4e38) would be stored as an
 * infinity, and standardising would then make every feature NaN: refused like inf. */
static void csv_values_beyond_float32_are_refused(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *rows[] = {"1,2,0\n3,1e39,1\n", "1,2,0\n-3.5e38,4,1\n"};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    char *path = test_write(dir, "f.csv", rows[i]);
    csv_fails_with(path, "f.csv:2");
    csv_fails_with(path, "float32");
    free(path);
  }
  char *path = test_write(dir, "edge.csv", "3.4e38,-3.4e38,0\n1,2,1\n");
  tr_dataset ds;
  csv_loads(path, &ds);
  assert_true(isfinite(tr_get(ds.x, 0)) && isfinite(tr_get(ds.x, 1)));
  tr_dataset_free(&ds);
  free(path);
  test_rmtree(dir);
  free(dir);
}

/* Values below the smallest double (strtod's underflow) are numbers: the first row holding
 * one is not taken for a header and dropped, nor a later one refused. */
static void csv_values_too_small_for_a_double_load_as_numbers(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  char *path = test_write(dir, "tiny.csv", "1e-320,2,0\n3,1e-400,1\n");
  tr_dataset ds;
  csv_loads(path, &ds);
  assert_int_equal(ds.n, 2);
  assert_true(tr_get(ds.x, 1) == 2.0f && tr_get(ds.x, 3) == 0.0f);
  tr_dataset_free(&ds);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void csv_labels_past_the_class_limit_are_refused(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char *rows[] = {"1,2,0\n3,4,2147483647\n", "1,2,0\n3,4,1000000000\n",
                        "1,2,0\n3,4,3e9\n", "1,2,0\n3,4,1e300\n"};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    char *path = test_write(dir, "big.csv", rows[i]);
    csv_fails_with(path, "big.csv:2");
    free(path);
  }
  /* the largest label allowed still loads */
  char *path = test_write(dir, "top.csv", "1,2,0\n3,4,65535\n");
  tr_dataset ds;
  csv_loads(path, &ds);
  assert_int_equal(ds.nclasses, 65536);
  tr_dataset_free(&ds);
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void csv_errors_name_the_line_of_the_file_counting_blank_lines(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  char *path = test_write(dir, "gaps.csv", "a,b,c\n\n1,2,0\n\n\n3,x,1\n");
  csv_fails_with(path, "gaps.csv:6:");
  free(path);
  path = test_write(dir, "head.csv", "a,b,c\n\n");
  csv_fails_with(path, "head.csv: a header and no data");
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void csv_with_a_nul_byte_is_refused_not_cut_short(void **state) {
  (void)state;
  char *dir = test_tmpdir();
  const char text[] = "1,2,0\n3,4,1\n\0\n5,6,2\n";
  char *path = write_bytes(dir, "nul.csv", (const unsigned char *)text, sizeof text - 1, false);
  csv_fails_with(path, "NUL byte");
  free(path);
  test_rmtree(dir);
  free(dir);
}

static void digits_csv_loads_with_all_examples(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 3);
  tr_dataset ds;
  assert_int_equal(tr_csv_load(&ctx, DIGITS, -1, &ds), NAS_OK);
  assert_int_equal(ds.n, 1797);
  assert_int_equal(ds.x->shape[1], 64);
  assert_int_equal(ds.nclasses, 10);
  tr_dataset_free(&ds);
}

static void split_is_seeded_and_keeps_every_example_once(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 4);
  tr_dataset ds, tr1, va1, tr2, va2;
  assert_int_equal(tr_csv_load(&ctx, DIGITS, -1, &ds), NAS_OK);
  assert_int_equal(tr_dataset_split(&ctx, &ds, 0.2, 42, &tr1, &va1), NAS_OK);
  assert_int_equal(tr_dataset_split(&ctx, &ds, 0.2, 42, &tr2, &va2), NAS_OK);
  assert_int_equal(va1.n, 359);
  assert_int_equal(tr1.n + va1.n, ds.n);
  assert_memory_equal(va1.y, va2.y, sizeof(int32_t) * (size_t)va1.n);
  double total = 0, parts = 0; /* same multiset of pixels overall */
  for (int64_t i = 0; i < ds.x->numel; i++) total += tr_get(ds.x, i);
  for (int64_t i = 0; i < tr1.x->numel; i++) parts += tr_get(tr1.x, i);
  for (int64_t i = 0; i < va1.x->numel; i++) parts += tr_get(va1.x, i);
  assert_true(total == parts);
  tr_dataset_free(&tr2);
  tr_dataset_free(&va2);
  assert_int_equal(tr_dataset_split(&ctx, &ds, 0.2, 43, &tr2, &va2), NAS_OK);
  assert_true(memcmp(va1.y, va2.y, sizeof(int32_t) * (size_t)va1.n) != 0);
  tr_dataset_free(&tr2);
  tr_dataset_free(&va2);
  tr_dataset_free(&tr1);
  tr_dataset_free(&va1);
  tr_dataset_free(&ds);
}

static void loader_yields_each_example_once_per_epoch_then_reshuffles(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 5);
  float xs[10];
  int32_t ys[10];
  for (int i = 0; i < 10; i++) {
    xs[i] = (float)i;
    ys[i] = i;
  }
  tr_dataset ds = {tr_from_data(&ctx, TR_F32, 2, (int64_t[]){10, 1}, xs), ys, 10, 10};
  tr_loader ld;
  nas_err err = {{0}};
  assert_int_equal(tr_loader_init(&ld, &ds, 4, true, 7, &err), NAS_OK);
  int32_t first[10], second[10];
  for (int epoch = 0; epoch < 2; epoch++) {
    int seen = 0, sizes[3] = {0};
    int32_t *order = epoch ? second : first;
    tr_tensor *x;
    int32_t *y;
    int64_t b;
    for (int k = 0; (b = tr_loader_next(&ctx, &ld, &x, &y)) > 0; k++) {
      sizes[k] = (int)b;
      for (int64_t i = 0; i < b; i++) {
        assert_true(tr_get(x, i) == (float)y[i]); /* features travel with their label */
        order[seen++] = y[i];
      }
      tr_release(x);
      free(y);
    }
    assert_int_equal(seen, 10);
    assert_true(sizes[0] == 4 && sizes[1] == 4 && sizes[2] == 2);
    int mask = 0;
    for (int i = 0; i < 10; i++) mask |= 1 << order[i];
    assert_int_equal(mask, 0x3ff);
  }
  assert_true(memcmp(first, second, sizeof first) != 0);
  tr_loader_free(&ld);
  tr_release(ds.x);
}

static void normalizer_gives_zero_mean_unit_variance_features(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 6);
  tr_dataset ds;
  tr_normalizer nz;
  nas_err err = {{0}};
  assert_int_equal(tr_csv_load(&ctx, DIGITS, -1, &ds), NAS_OK);
  assert_int_equal(tr_normalizer_fit(&ds, &nz, &err), NAS_OK);
  assert_int_equal(tr_normalizer_apply(&nz, &ds, &err), NAS_OK);
  double mean = 0, var = 0;
  int f = 20; /* a pixel that varies */
  for (int64_t i = 0; i < ds.n; i++) mean += tr_get(ds.x, i * 64 + f);
  mean /= (double)ds.n;
  for (int64_t i = 0; i < ds.n; i++) var += pow(tr_get(ds.x, i * 64 + f) - mean, 2);
  assert_true(fabs(mean) < 1e-4 && fabs(var / (double)ds.n - 1) < 1e-3);
  tr_normalizer_free(&nz);
  tr_dataset_free(&ds);
}

/* ---------------------------------------------------------------- training */

static double accuracy(tr_ctx *ctx, tr_module *m, const tr_dataset *ds) {
  tr_module_train(m, false);
  bool prev = tr_set_grad_enabled(ctx, false);
  tr_tensor *logits = tr_module_forward(ctx, m, ds->x);
  tr_set_grad_enabled(ctx, prev);
  tr_module_train(m, true);
  assert_non_null(logits);
  int64_t right = 0, c = logits->shape[1];
  for (int64_t i = 0; i < ds->n; i++) {
    const float *row = tr_f32(logits) + i * c;
    int64_t best = 0;
    for (int64_t k = 1; k < c; k++)
      if (row[k] > row[best]) best = k;
    right += best == ds->y[i];
  }
  tr_release(logits);
  return (double)right / (double)ds->n;
}

static void mlp_on_digits_reaches_95_percent_validation_accuracy(void **state) {
  (void)state;
  tr_ctx ctx;
  tr_ctx_init(&ctx, 2024);
  ctx.alloc = tr_allocator_new((size_t)64 << 20);
  tr_dataset all, train, val;
  tr_normalizer nz;
  nas_err err = {{0}};
  assert_int_equal(tr_csv_load(&ctx, DIGITS, -1, &all), NAS_OK);
  assert_int_equal(tr_dataset_split(&ctx, &all, 0.2, 1, &train, &val), NAS_OK);
  assert_int_equal(tr_normalizer_fit(&train, &nz, &err), NAS_OK);
  assert_int_equal(tr_normalizer_apply(&nz, &train, &err), NAS_OK);
  assert_int_equal(tr_normalizer_apply(&nz, &val, &err), NAS_OK);
  tr_module *m = tr_sequential_new(&ctx);
  tr_sequential_add(&ctx, m, tr_linear_new(&ctx, 64, 128, true));
  tr_sequential_add(&ctx, m, tr_activation_new(&ctx, TR_RELU));
  tr_sequential_add(&ctx, m, tr_linear_new(&ctx, 128, 10, true));
  tr_param_list params = {0};
  tr_module_parameters(m, false, &params, &err);
  tr_optim *opt =
      tr_optim_new(&ctx, &(tr_optim_config){.kind = TR_SGD, .lr = 0.05, .momentum = 0.9},
                   params.items, params.n);
  tr_lr_schedule sched = {.kind = TR_LR_COSINE, .base_lr = 0.05, .warmup = 20, .total = 20 * 45};
  tr_loader ld;
  assert_int_equal(tr_loader_init(&ld, &train, 32, true, 3, &err), NAS_OK);
  int64_t step = 0;
  double start = nas_monotonic();
  for (int epoch = 0; epoch < 20; epoch++) {
    tr_tensor *x;
    int32_t *y;
    while (tr_loader_next(&ctx, &ld, &x, &y) > 0) {
      tr_optim_set_lr(opt, tr_lr_at(&sched, step++));
      tr_tensor *logits = tr_module_forward(&ctx, m, x);
      tr_tensor *loss = tr_cross_entropy(&ctx, logits, y);
      assert_non_null(loss);
      tr_optim_zero_grad(opt);
      assert_int_equal(tr_backward(&ctx, loss, NULL, false), NAS_OK);
      assert_int_equal(tr_optim_step(&ctx, opt), NAS_OK);
      tr_release(loss);
      tr_release(logits);
      tr_release(x);
      free(y);
    }
  }
  double acc = accuracy(&ctx, m, &val);
  print_message("digits MLP: validation accuracy %.4f after %lld steps in %.2f s\n", acc,
                (long long)step, nas_monotonic() - start);
  assert_true(acc >= 0.95);
  tr_loader_free(&ld);
  tr_optim_free(opt);
  tr_param_list_free(&params);
  tr_module_free(m);
  tr_normalizer_free(&nz);
  tr_dataset_free(&train);
  tr_dataset_free(&val);
  tr_dataset_free(&all);
  tr_allocator_release(ctx.alloc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(idx_loader_reads_gzip_and_plain_files),
      cmocka_unit_test(fashion_mnist_test_set_loads_when_installed),
      cmocka_unit_test(csv_loader_skips_a_header_and_reports_bad_lines),
      cmocka_unit_test(idx_dims_whose_product_overflows_are_refused),
      cmocka_unit_test(idx_examples_of_no_values_are_refused),
      cmocka_unit_test(idx_data_longer_than_its_dims_say_is_refused),
      cmocka_unit_test(gzip_file_cut_short_is_an_error_not_fewer_rows),
      cmocka_unit_test(csv_nan_or_infinite_values_are_refused),
      cmocka_unit_test(csv_values_beyond_float32_are_refused),
      cmocka_unit_test(csv_values_too_small_for_a_double_load_as_numbers),
      cmocka_unit_test(csv_labels_past_the_class_limit_are_refused),
      cmocka_unit_test(csv_errors_name_the_line_of_the_file_counting_blank_lines),
      cmocka_unit_test(csv_with_a_nul_byte_is_refused_not_cut_short),
      cmocka_unit_test(digits_csv_loads_with_all_examples),
      cmocka_unit_test(split_is_seeded_and_keeps_every_example_once),
      cmocka_unit_test(loader_yields_each_example_once_per_epoch_then_reshuffles),
      cmocka_unit_test(normalizer_gives_zero_mean_unit_variance_features),
      cmocka_unit_test(mlp_on_digits_reaches_95_percent_validation_accuracy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
