//! Routers that do what no panic handler can catch, for the tests of `routelab … --isolate`
//! (never use them for anything else). Each routes round robin for its first request, then:
//! - `aborts`: calls `std::process::abort` (SIGABRT);
//! - `exits`: calls `std::process::exit(0)`, so the process ends "successfully" without a result;
//! - `overflows_stack`: recurses without bound (the runtime's guard page aborts the process);
//! - `loops_forever`: never returns;
//! - `allocates_forever`: allocates and touches 64 MiB blocks until the allocator fails;
//! - `segfaults`: writes through a null pointer (SIGSEGV);
//! - `prints`: routes round robin and writes a line to stdout on every request (must not reach
//!   the host's tables);
//! - `floods_stderr`: writes 64 MiB to stderr, then a last line, then aborts (the parent must
//!   keep a bounded head and tail of it);
//! - `many_figures`: routes round robin and reports `ROUTELAB_TEST_FIGURES` figures (default
//!   100,000; the parent's handling of a result must stay linear in their number).

use std::hint::black_box;

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Default, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct NoConfig {}

/// What a hostile router does from its second request on.
trait Misdeed {
    const NAME: &'static str;
    const DESCRIPTION: &'static str;
    fn misbehave(replicas: usize) -> usize;
}

/// Round robin for the first request, then the misdeed `M`.
pub struct Hostile<M> {
    seen: u64,
    _m: std::marker::PhantomData<fn() -> M>,
}

impl<M: Misdeed + 'static> Policy for Hostile<M> {
    const NAME: &'static str = M::NAME;
    const DESCRIPTION: &'static str = M::DESCRIPTION;
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self { seen: 0, _m: std::marker::PhantomData })
    }
}

impl<M: Misdeed + 'static> RouterPolicy for Hostile<M> {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.seen += 1;
        if self.seen == 1 {
            return 0;
        }
        M::misbehave(replicas.len())
    }
}

pub struct Aborts;
impl Misdeed for Aborts {
    const NAME: &'static str = "aborts";
    const DESCRIPTION: &'static str = "aborts the process on its second request (test fixture)";
    fn misbehave(_: usize) -> usize {
        std::process::abort()
    }
}

pub struct Exits;
impl Misdeed for Exits {
    const NAME: &'static str = "exits";
    const DESCRIPTION: &'static str = "calls process::exit(0) on its second request (test fixture)";
    fn misbehave(_: usize) -> usize {
        std::process::exit(0)
    }
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    // A frame the optimiser cannot fold into a loop.
    let frame = black_box([depth; 64]);
    recurse(black_box(depth + 1)) + frame[(depth % 64) as usize]
}

pub struct OverflowsStack;
impl Misdeed for OverflowsStack {
    const NAME: &'static str = "overflows_stack";
    const DESCRIPTION: &'static str = "recurses without bound on its second request (test fixture)";
    fn misbehave(replicas: usize) -> usize {
        recurse(0) as usize % replicas
    }
}

pub struct LoopsForever;
impl Misdeed for LoopsForever {
    const NAME: &'static str = "loops_forever";
    const DESCRIPTION: &'static str = "never returns from its second request (test fixture)";
    fn misbehave(_: usize) -> usize {
        let mut n = 0u64;
        loop {
            n = black_box(n.wrapping_add(1));
        }
    }
}

pub struct AllocatesForever;
impl Misdeed for AllocatesForever {
    const NAME: &'static str = "allocates_forever";
    const DESCRIPTION: &'static str = "allocates 64 MiB blocks until memory runs out (test fixture)";
    fn misbehave(_: usize) -> usize {
        let mut blocks: Vec<Vec<u8>> = Vec::new();
        loop {
            // Filled with ones, so every page is touched (zeroed blocks could stay unmapped).
            blocks.push(black_box(vec![1u8; 64 << 20]));
        }
    }
}

pub struct Segfaults;
impl Misdeed for Segfaults {
    const NAME: &'static str = "segfaults";
    const DESCRIPTION: &'static str = "writes through a null pointer on its second request (test fixture)";
    fn misbehave(_: usize) -> usize {
        let p: *mut u64 = black_box(std::ptr::null_mut());
        // SAFETY: none — this is the fault the fixture exists to raise.
        unsafe { std::ptr::write_volatile(p, 1) };
        0
    }
}

/// Round robin that writes to stdout on every request.
pub struct Prints {
    seen: usize,
}

impl Policy for Prints {
    const NAME: &'static str = "prints";
    const DESCRIPTION: &'static str = "round robin that prints on every request (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self { seen: 0 })
    }
}

impl RouterPolicy for Prints {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.seen += 1;
        println!("HOSTILE PLUGIN OUTPUT {}", self.seen);
        self.seen % replicas.len()
    }
}

pub struct FloodsStderr;
impl Misdeed for FloodsStderr {
    const NAME: &'static str = "floods_stderr";
    const DESCRIPTION: &'static str = "writes 64 MiB to stderr, then aborts on its second request (test fixture)";
    fn misbehave(_: usize) -> usize {
        use std::io::Write;
        let line = [b'x'; 1023];
        let mut err = std::io::stderr().lock();
        for _ in 0..(64 << 10) {
            err.write_all(&line).ok();
            err.write_all(b"\n").ok();
        }
        writeln!(err, "the flood's last words").ok();
        drop(err);
        std::process::abort()
    }
}

/// Round robin that reports many figures.
pub struct ManyFigures {
    seen: usize,
}

impl Policy for ManyFigures {
    const NAME: &'static str = "many_figures";
    const DESCRIPTION: &'static str = "round robin reporting ROUTELAB_TEST_FIGURES figures (test fixture)";
    type Config = NoConfig;
    type Context = RouterContext;
    fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
        Ok(Self { seen: 0 })
    }
}

impl RouterPolicy for ManyFigures {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.seen += 1;
        self.seen % replicas.len()
    }

    fn report(&self) -> Vec<(String, f64)> {
        let n = std::env::var("ROUTELAB_TEST_FIGURES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000usize);
        (0..n).map(|i| (format!("f{i}"), i as f64)).collect()
    }
}

fn registry() -> Vec<Entry> {
    vec![
        router::<Hostile<Aborts>>(),
        router::<Hostile<Exits>>(),
        router::<Hostile<OverflowsStack>>(),
        router::<Hostile<LoopsForever>>(),
        router::<Hostile<AllocatesForever>>(),
        router::<Hostile<Segfaults>>(),
        router::<Prints>(),
        router::<Hostile<FloodsStderr>>(),
        router::<ManyFigures>(),
    ]
}

export_policies!(registry);
