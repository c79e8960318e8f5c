/* examples/branin_currin.c: a two-objective toy trial for the quickstart.
 *
 * Usage: branin_currin --x1=X --x2=X   (both in [0, 1])
 * Prints one metric line with the Branin and Currin functions as BoTorch defines the
 * BraninCurrin problem (Branin on the rescaled square [-5, 10] × [0, 15]; both minimised):
 *   nas-metric {"branin": …, "currin": …}
 * It stands in for a training script: any program that prints such a line can be a trial. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double branin(double x1, double x2) {
  double u = 15.0 * x1 - 5.0, v = 15.0 * x2;
  double b = 5.1 / (4.0 * M_PI * M_PI), c = 5.0 / M_PI, t = 1.0 / (8.0 * M_PI);
  double w = v - b * u * u + c * u - 6.0;
  return w * w + 10.0 * (1.0 - t) * cos(u) + 10.0;
}

static double currin(double x1, double x2) {
  double factor = x2 > 0 ? 1.0 - exp(-1.0 / (2.0 * x2)) : 1.0;
  double num = 2300.0 * x1 * x1 * x1 + 1900.0 * x1 * x1 + 2092.0 * x1 + 60.0;
  double den = 100.0 * x1 * x1 * x1 + 500.0 * x1 * x1 + 4.0 * x1 + 20.0;
  return factor * num / den;
}

/* Reads "--NAME=VALUE" for name into *out; returns 1 when argv held it. */
static int read_arg(int argc, char **argv, const char *name, double *out) {
  size_t len = strlen(name);
  for (int i = 1; i < argc; i++)
    if (strncmp(argv[i], name, len) == 0 && argv[i][len] == '=') {
      char *end;
      *out = strtod(argv[i] + len + 1, &end);
      return *end == '\0';
    }
  return 0;
}

int main(int argc, char **argv) {
  double x1, x2;
  if (!read_arg(argc, argv, "--x1", &x1) || !read_arg(argc, argv, "--x2", &x2) || x1 < 0 ||
      x1 > 1 || x2 < 0 || x2 > 1) {
    fprintf(stderr, "usage: branin_currin --x1=X --x2=X (X in [0, 1])\n");
    return 2;
  }
  printf("nas-metric {\"branin\": %.17g, \"currin\": %.17g}\n", branin(x1, x2), currin(x1, x2));
  return 0;
}
