//! The compile rules of specs that target wgpu (its emitter: `moek_lower::wgsl`).

use moek_ir::{Kernel, Selection};

impl crate::check::Checker {
    pub(crate) fn wgpu_rules(
        &mut self,
        spec: &crate::ast::Spec,
        k: &Kernel,
        p: &crate::check::Parsed,
    ) {
        if k.schedule.select == Selection::Grouped {
            let span = p
                .select
                .as_ref()
                .map_or(spec.name.span(), |s| s.mode.span());
            self.errors.push(span, "grouped selection has data-dependent group sizes, which the wgpu emitter does not generate: use `gather` or `dense`, or drop `wgpu`");
        }
    }
}
