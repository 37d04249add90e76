"""`gpuspeed decode`: the decode ladder (V0 naive .. V5 fast) on a named Llama shape or a real checkpoint."""

from __future__ import annotations

import sys
import time

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def decode(
        model: str = typer.Option("tiny", "--model", help="tiny, smollm2-135m, llama-3.2-1b, llama-3-8b, "
                                                          "llama-3-70b (random weights; the 70B needs --tp N, or "
                                                          "--layers to cut it) or a path to a .gguf file or an HF "
                                                          "folder."),
        dtype: str = typer.Option("fp32", "--dtype", help="fp32, bf16 or fp16."),
        variants: str = typer.Option("all", "--variants", help="Comma-separated: V0,V1,V2,V3,V4,V4c,V5, or all."),
        batch: int = typer.Option(1, "--batch", help="Sequences decoded together."),
        prompt_len: int = typer.Option(None, "--prompt-len", help="Random prompt length (default 32; 8 on a CPU)."),
        prompt: str = typer.Option(None, "--prompt", help="A text prompt (checkpoints with a tokenizer)."),
        new_tokens: int = typer.Option(None, "--new-tokens", help="Tokens generated (default 128; 16 on a CPU)."),
        batches: str = typer.Option(None, "--batches", help="Also time the best variant at these batch sizes (8,32)."),
        long_prompt: int = typer.Option(None, "--long-prompt", help="Also time the best variant at this prompt length."),
        temperature: float = typer.Option(0.0, "--temperature", help="0: greedy (the exactness checks need it)."),
        top_k: int = typer.Option(None, "--top-k", help="Sample among the k most likely tokens (ties with the "
                                                        "k-th kept, as transformers does; 1 is greedy, 0 none)."),
        top_p: float = typer.Option(None, "--top-p", help="Sample from the smallest most-likely-first set whose "
                                                          "mass reaches this (after --top-k)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random weights, prompt and sampling."),
        layers: int = typer.Option(None, "--layers", help="Use only this many layers of a named model (CPU demos)."),
        compile_backend: str = typer.Option("inductor", "--compile-backend",
                                            help="torch.compile backend of V3/V4c/V5 (eager: trace only, fast)."),
        no_hf: bool = typer.Option(False, "--no-hf", help="Skip the transformers generate comparison rows."),
        no_profile: bool = typer.Option(False, "--no-profile", help="Skip kernels/syncs per token and traces."),
        time_cap: float = typer.Option(None, "--time-cap", help="Seconds; variants past it are skipped, recorded."),
        budget: float = typer.Option(None, "--budget", help="Seconds of timing per variant (default 2; 0.5 CPU)."),
        read_roof: float = typer.Option(None, "--read-roof", help="GB/s: a read ceiling measured earlier in the "
                                                                  "same session (default: measured now)."),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto."),
        tp_ranks: int = typer.Option(1, "--tp", help="Tensor parallel over N ranks (torchrun's launcher; one GPU "
                                                     "each, NCCL; gloo on the CPU); rank 0 writes the results."),
        quant: str = typer.Option(None, "--quant", help="int8: weight-only int8 (per-row scales), compared with "
                                                        "the unquantized model in --dtype."),
        out: str = typer.Option(None, "--out", help="Write decode.json, decode_ladder.png, decode_bandwidth.png "
                                                    "and traces/ here."),
        as_json: bool = typer.Option(False, "--json", help="Print the results document as JSON."),
    ):
        """Decode ladder: ms/token, GB/s of weights vs the read roof, exact tokens, vs transformers generate."""
        from gpuspeed.commands import cpu_line, esc, make_console, progress_bar

        from gpuspeed.decode import study
        from gpuspeed.decode.generate import Sampling
        from gpuspeed.decode.variants import parse_variants
        from gpuspeed.device import resolve_device
        from gpuspeed.results import check_out_dir, signals_held, stop_signals

        from gpuspeed.errors import UserError

        if prompt is not None and prompt_len is not None:  # the text sets the length: one would be ignored
            raise UserError("--prompt and --prompt-len are exclusive: a text prompt's length is its tokens")
        sampling, sampling_note = Sampling.from_options(temperature, top_k, top_p, seed)
        out = check_out_dir(out)  # a bad --out fails now, not after minutes of measuring
        where = resolve_device(device)
        small = where != "cuda"
        spec = study.Spec(model=model, dtype=dtype, variants=parse_variants(variants), batch=batch,
                          prompt_len=prompt_len, prompt=prompt,  # None: the device's default (Spec)
                          new_tokens=new_tokens,
                          device=device, seed=seed, compile_backend=compile_backend, hf=not no_hf,
                          profile=not no_profile, batches=batches, long_prompt=long_prompt,
                          time_cap_s=time_cap, max_layers=layers,
                          bench_budget_s=budget,
                          out=out, read_roof_GBps=read_roof,
                          sampling=sampling,
                          tp=tp_ranks, quant=quant)
        study.check_spec(spec)
        if tp_ranks > 1:
            from gpuspeed.decode import tp as tensor_parallel

            tensor_parallel.check_launch(tp_ranks, where)
        study.check_fits(spec, where)  # before anything prints (run and launch check it again, as their callers may not)
        console = make_console(stderr=as_json)
        if small and not as_json:
            console.print(f"[yellow]{esc(cpu_line())}[/]: the ladder runs on the CPU at small sizes "
                          "(graphs run eagerly); the numbers are CPU numbers. Every rung and the transformers rows take "
                          "a minute or more: --variants V2,V5 --no-hf for a quick look.")
        bar_console = make_console(stderr=True)
        # off a terminal (a log, a pipe, CI) the bar is hidden and says each step in a plain line on stderr instead
        # Ctrl-C or SIGTERM: one line and 130 / 143; the run writes the rungs it measured into --out as it goes
        started = time.time()
        with stop_signals(lambda: study.partial_kept(out, started)), \
                progress_bar(36, console=bar_console, name="gpuspeed decode") as bar:
            steps = [study.progress_steps(spec)]  # run() tells the exact count as it learns it
            task = bar.add_task("decode", total=steps[0])

            def progress(what: str) -> None:
                bar.update(task, advance=1, description=what)

            def total(n: int) -> None:
                steps[0] = n
                bar.update(task, total=n)

            if tp_ranks > 1:  # the ranks run in their own processes: rank 0's steps come back through launch()
                total(steps[0] + 1)
                progress(f"starting {tp_ranks} ranks (tensor parallel)")
                doc = tensor_parallel.launch(spec, tp_ranks, progress=progress, total=lambda n: total(n + 1))
            else:
                doc = study.run(spec, progress=progress, total=total)
            bar.update(task, completed=steps[0], description="done")
        if sampling_note:
            doc["notes"].append(sampling_note)
        paths = []
        if out:
            with signals_held():  # a Ctrl-C now waits until every file is whole
                paths = study.write_artifacts(doc, out)  # a plot failure is a note in decode.json, not an exit 2
                study.drop_partial(out, started)
        nothing = study.nothing_measured(doc)
        if as_json:
            from gpuspeed.results import strict_json  # NaN and inf as null: stdout parses as strict JSON

            print(strict_json(doc))
            for note in (n for n in doc["notes"] if n.startswith("plot failed:")):  # stdout is the JSON: say it here
                print(f"gpuspeed: {note}", file=sys.stderr)
            if nothing:
                print(f"gpuspeed: {nothing}", file=sys.stderr)
                raise typer.Exit(1)
            return
        from rich.table import Table

        t = Table(title=f"decode {esc(spec.label())} on {esc(doc['device'].get('name', '?'))}")
        for col in study.COLUMNS:
            t.add_column(col, justify="left" if col == "variant" else "right")
        for cells in study.table_rows(doc):
            t.add_row(*map(esc, cells))  # a failed row's cell holds its error: torch's '[enforce fail at ...]'
        console.print(t)
        for key, val in doc["summary"].items():
            console.print(f"  {esc(key)}: {esc(study._fmt(val, '.4g'))}", highlight=False)
        batch_texts = doc["params"].get("batch_texts") or {}
        for name, text in (doc["params"].get("texts") or {}).items():
            for label, seq in ([(f"{name} [{i}]", t) for i, t in enumerate(batch_texts[name])] if name in batch_texts
                               else [(name, text)]):
                console.print(f"  {label}: {seq!r}", highlight=False, markup=False)
        for r in doc["rows"]:
            for note in r.get("notes") or []:
                console.print(f"  {r['variant']}: {note}", style="dim", highlight=False, markup=False)
        for note in doc["notes"]:
            console.print(f"[dim]{esc(note)}[/]")
        for p in paths:
            console.print(f"wrote {esc(p)}")
        if nothing:  # the results are written (every row says why), but a run that measured nothing is not a success
            console.print(f"[red]{esc(nothing)}[/]", highlight=False, soft_wrap=True)
            raise typer.Exit(1)
