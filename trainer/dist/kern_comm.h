/* Reduction kernels of the collectives over type T (included twice by comm.c): n contiguous
 * elements each. Element i of a sum only ever meets element i of another rank, in rank
 * order, so vectorising these loops changes no result. */

/* acc += src */
static void S(comm_add)(void *accv, const void *srcv, int64_t n) {
  T *acc = accv;
  const T *src = srcv;
  for (int64_t i = 0; i < n; i++) acc[i] += src[i];
}

/* acc /= world: the average of a rank-order sum (a division, not a multiply by 1/world, so
 * that a serial reference written the obvious way agrees bit for bit). */
static void S(comm_div)(void *accv, int64_t n, int world) {
  T *acc = accv;
  const T w = (T)world;
  for (int64_t i = 0; i < n; i++) acc[i] /= w;
}
