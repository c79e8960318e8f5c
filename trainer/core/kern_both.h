/* trainer/core/kern_both.h: instantiates a kernel header for float and for double.
 *
 *   #define KERN_FILE "trainer/ops/kern_loss.h"
 *   #include "trainer/core/kern_both.h"
 *
 * A kernel header writes its math once over the type T with names S(name); this includes
 * it twice, as T = float with names name_f32 and T = double with name_f64, so float64
 * gradient checks run the very code that trains. Deliberately without include guard. */
#define T float
#define S(name) name##_f32
#include KERN_FILE
#undef T
#undef S
#define T double
#define S(name) name##_f64
#include KERN_FILE
#undef T
#undef S
#undef KERN_FILE
