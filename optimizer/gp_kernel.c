/* optimizer/gp_kernel.c: the ARD kernels of the GP (RBF and Matérn-5/2), their kernel
 * matrices and their gradients (see gp.h).
 *
 * Both kernels have unit variance and are written as functions of the scaled squared
 * distance r², so that lengthscale and input gradients share one factor, the slope
 * g(r²) = −2 dk/d(r²), which stays finite at r = 0 (Matérn-5/2 has no 1/r there).
 *
 * The distances of many points to one (a kernel column, a row of a kernel matrix) are
 * summed a dimension at a time over all the points, from the points transposed (d×n): each
 * point's sum still adds its dimensions in order (so r² is the same to the bit as the sum
 * of one point's dimensions in a loop), but the sums of different points are independent
 * and run side by side (SIMD), where one point's sum is a chain of d dependent additions
 * (in a 65-dimension space those chains were most of an acquisition evaluation's kernel
 * time). The fit's kernel matrices, built thousands of times per suggestion, take their
 * distances from one BLAS-3 product instead (gp_fit.c). */
#include <math.h>

#include "optimizer/gp.h"

static const double SQRT5 = 2.23606797749978969641;

/* RBF: k = exp(−r²/2), so g = k. Matérn-5/2: k(r) = (1 + √5 r + 5r²/3)e^{−√5 r},
 * dk/dr = −(5/3) r (1 + √5 r) e^{−√5 r}, and −2 dk/d(r²) = −(dk/dr)/r. */
double gp_kernel_eval(gp_kernel kind, double r2, double *slope) {
  if (kind == GP_KERNEL_RBF) {
    double k = exp(-0.5 * r2);
    if (slope) *slope = k;
    return k;
  }
  double s5r = SQRT5 * sqrt(r2);
  double e = exp(-s5r);
  if (slope) *slope = 5.0 / 3.0 * (1.0 + s5r) * e;
  return (1.0 + s5r + 5.0 / 3.0 * r2) * e;
}

void gp_kernel_matrix(gp_kernel kind, const double *X, const double *Xt, size_t n, size_t d,
                      const double *inv_ls2, double *K) {
  for (size_t i = 0; i < n; i++) {
    double *row = K + i * n; /* r² to the points before i, then their kernel values */
    gp_kernel_r2_column(Xt, n, i, d, inv_ls2, X + i * d, row);
    for (size_t j = 0; j < i; j++) {
      row[j] = gp_kernel_eval(kind, row[j], NULL);
      K[j * n + i] = row[j];
    }
    row[i] = 1.0;
  }
}

void gp_kernel_r2_column(const double *Xt, size_t ld, size_t n, size_t d,
                         const double *inv_ls2, const double *x, double *r2) {
  for (size_t i = 0; i < n; i++) r2[i] = 0;
  for (size_t k = 0; k < d; k++) {
    const double xk = x[k], w = inv_ls2[k], *row = Xt + k * ld;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
      double diff = xk - row[i];
      r2[i] += diff * diff * w;
    }
  }
}

void gp_kernel_column(gp_kernel kind, const double *Xt, size_t n, size_t d, const double *inv_ls2,
                   const double *x, double *k, double *dk) {
  gp_kernel_r2_column(Xt, n, n, d, inv_ls2, x, k); /* k holds r² until the kernel replaces it */
  for (size_t i = 0; i < n; i++) {
    double g;
    k[i] = gp_kernel_eval(kind, k[i], &g);
    if (!dk) continue;
    for (size_t j = 0; j < d; j++) dk[i * d + j] = -g * (x[j] - Xt[j * n + i]) * inv_ls2[j];
  }
}

void gp_transpose(const double *X, size_t n, size_t d, double *Xt) {
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < d; k++) Xt[k * n + i] = X[i * d + k];
}
