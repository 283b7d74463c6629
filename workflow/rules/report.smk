# Records -> tidy table -> the paper's tables and the figures. Nothing here runs a cell.


rule build_tidy_table:
    input:
        records=records(),
        evidence=evidence_records(),
        searches=search_folders(),
        measured=lambda wildcards: searched_records(),
    output:
        csv=f"{R}/tables/records.csv",
        parquet=f"{R}/tables/records.parquet",
        requests=f"{R}/tables/requests.parquet",
        micro=f"{R}/tables/micro.parquet",
        profile=f"{R}/tables/profile.parquet",
    log:
        f"{R}/logs/report/build_tidy_table.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_tidy_table.py"


rule build_findings_table:
    input:
        tidy=f"{R}/tables/records.csv",
        profile=f"{R}/tables/profile.parquet",
        micro=f"{R}/tables/micro.parquet",
        findings=FINDINGS_FILE,
        reference=expand("config/reference/{table}.csv", table=["table2", "table3", "table4", "table9", "fig4",
                         "table12", "profile_phases", "profile_attention", "profile_comm"]),
    output:
        csv=f"{R}/tables/findings.csv",
        md=f"{R}/tables/findings.md",
        missing=f"{R}/tables/findings-missing.csv",
    params:
        models=config.get("findings_models"),
    log:
        f"{R}/logs/report/build_findings_table.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_findings_table.py"


rule build_search_table:
    input:
        searches=search_folders(),
        measured=lambda wildcards: searched_records(),
    output:
        csv=f"{R}/tables/search.csv",
        md=f"{R}/tables/search.md",
    log:
        f"{R}/logs/report/build_search_table.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_search_table.py"


rule build_paper_table:
    input:
        tidy=f"{R}/tables/records.csv",
        reference="config/reference/{table}.csv",
    output:
        csv=f"{R}/tables/{{table}}.csv",
        md=f"{R}/tables/{{table}}.md",
    log:
        f"{R}/logs/report/build_paper_table-{{table}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_paper_table.py"


rule build_serving_table:
    input:
        tidy=f"{R}/tables/records.csv",
    output:
        csv=f"{R}/tables/serving.csv",
        md=f"{R}/tables/serving.md",
    log:
        f"{R}/logs/report/build_serving_table.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_serving_table.py"


rule build_scaling_table:
    input:
        tidy=f"{R}/tables/records.csv",
        reference="config/reference/fig4.csv",
    output:
        csv=f"{R}/tables/scaling.csv",
        md=f"{R}/tables/scaling.md",
    log:
        f"{R}/logs/report/build_scaling_table.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_scaling_table.py"


rule build_micro_table:
    input:
        micro=f"{R}/tables/micro.parquet",
        reference="config/reference/table12.csv",
    output:
        csv=f"{R}/tables/{{micro_table}}.csv",
        md=f"{R}/tables/{{micro_table}}.md",
    log:
        f"{R}/logs/report/build_micro_table-{{micro_table}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_micro_table.py"


rule build_profile_table:
    input:
        tidy=f"{R}/tables/records.csv",
        profile=f"{R}/tables/profile.parquet",
        reference=expand("config/reference/{table}.csv", table=["profile_phases", "profile_modules", "profile_attention", "profile_serve", "profile_comm"]),
    output:
        csv=f"{R}/tables/{{profile_table}}.csv",
        md=f"{R}/tables/{{profile_table}}.md",
    log:
        f"{R}/logs/report/build_profile_table-{{profile_table}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/build_profile_table.py"


rule render_report_tables:
    input:
        md=[f"{R}/tables/{t}.md" for t in REPORT_TABLES],
    output:
        [report(f"{R}/tables/{t}.html", category=SECTION_OF[t], subcategory="Tables", labels={"table": t})
         for t in REPORT_TABLES],
    log:
        f"{R}/logs/report/render_report_tables.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/render_report_tables.py"


rule plot_figure:
    input:
        tidy=f"{R}/tables/records.csv",
        requests=f"{R}/tables/requests.parquet",
        micro=f"{R}/tables/micro.parquet",
        profile=f"{R}/tables/profile.parquet",
    output:
        html=f"{R}/figures/{{figure}}.html",
        svg=report(f"{R}/figures/{{figure}}.svg", caption="../report/figure.rst",
                   category=lambda wildcards: SECTION_OF[wildcards.figure], subcategory="Figures",
                   labels={"figure": "{figure}"}),
        png=f"{R}/figures/{{figure}}.png",
    log:
        f"{R}/logs/report/plot_figure-{{figure}}.log",
    conda:
        "../../envs/report.yaml"
    script:
        "../scripts/plot_figure.py"
