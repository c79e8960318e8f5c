/* optimizer/taken.h: the assignments an optimizer must not propose again, and how to find
 * one that is free (internal to optimizer/; every backend uses it, gp included).
 *
 * Assignments are compared by their snapped encodings (space_snap), so two JSON objects
 * that differ only in how a number is written (3 vs 3.0) or in inactive parameters are the
 * same assignment. */
#ifndef NAS_OPTIMIZER_TAKEN_H
#define NAS_OPTIMIZER_TAKEN_H

#include <stdint.h>

#include "optimizer/optimizer.h"

typedef struct taken_set taken_set;

/* The set of observed and pending assignments. Ones that do not encode in sp (written for
 * an earlier version of the spec) are left out: no assignment of sp can equal them. */
int taken_create(const space *sp, const observation *obs, size_t n_obs,
                 const json_t *const *pending, size_t n_pending, taken_set **out, nas_err *err);
void taken_free(taken_set *t);
/* Whether the snapped point x (space_ndim values) is taken. */
bool taken_contains(const taken_set *t, const double *x);
/* Adds the snapped point x. */
int taken_add(taken_set *t, const double *x, nas_err *err);

/* Finds a free assignment for trial `number` and takes it: x receives its snapped point.
 * Tries the candidate first (when not NULL; any point of the cube; it may be x itself),
 * then up to 100 random points from the trial's streams (see taken_random_point); a finite
 * space that still has room then gets a uniform pick among its free assignments. Fails when the
 * space is exhausted, saying so. Deterministic in (seed, number, the taken set). */
int taken_fresh(taken_set *t, long seed, int number, const double *candidate, double *x,
                nas_err *err);

/* The suggest loop of the design-based backends: for trial first_number + i takes a free
 * assignment (taken_fresh from candidates[i], a row of the n×space_ndim matrix candidates,
 * or from random points when candidates is NULL) and decodes it into out[i]. Observed,
 * pending and earlier suggestions of the call are all taken. On failure out[] is NULL. */
int taken_suggest(const space *sp, long seed, const observation *obs, size_t n_obs,
                  const json_t *const *pending, size_t n_pending, size_t n, int first_number,
                  const double *candidates, json_t **out, nas_err *err);

/* A uniform random point of the cube (space_from_uniform of mt19937 draws) from stream
 * (number, attempt): the random optimizer's suggestion for trial `number` is attempt 0. */
int taken_random_point(const space *sp, long seed, int number, unsigned attempt, double *x,
                       nas_err *err);

#endif
